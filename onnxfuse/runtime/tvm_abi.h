/*
 * How a TVM-compiled kernel is called, and the hooks it expects its host to fill.
 *
 * The calling convention comes from the headers the installed wheels ship, which library.py puts
 * on the include path when it builds a library (they are C and architecture independent):
 *   - tvm/ffi/c_api.h (apache-tvm-ffi): TVMFFIAny, TVMFFISafeCallType, the type indices and
 *     TVMFFIErrorSetRaisedFromCStrParts; it includes dlpack/dlpack.h (DLTensor, DLDataType);
 *   - tvm/runtime/c_backend_api.h (apache-tvm): TVMParallelGroupEnv and FTVMParallelLambda.
 * The built library needs neither wheel: only their declarations are compiled in.
 *
 * A kernel object defines `int __tvm_ffi_<name>(void *self, const TVMFFIAny *args, int32_t n,
 * TVMFFIAny *ret)`, taking one DLTensor pointer per tensor (inputs, then outputs). It returns 0,
 * or -1 after reporting the error through TVMFFIErrorSetRaisedFromCStrParts, which the host
 * defines.
 *
 * What no shipped header declares, and so is declared here: the backend hooks. c_backend_api.h
 * declares them as the FUNCTIONS TVMBackendParallelLaunch etc. that libtvm_runtime exports, but
 * a kernel compiled to an object does not call those: it calls through DATA symbols named
 * __TVMBackendParallelLaunch etc., pointers it defines and the host fills before the first call.
 * Their types are taken from those declarations, so they cannot drift from them.
 */
#ifndef ONNXFUSE_TVM_ABI_H
#define ONNXFUSE_TVM_ABI_H

#include <tvm/ffi/c_api.h>
#include <tvm/runtime/c_backend_api.h>

typedef TVMFFISafeCallType tvm_kernel_fn;

/* The hook slots' types. Launch: num_task 0 means "as many as the host likes"; 0, or -1 if any
 * task failed. */
typedef __typeof__(&TVMBackendParallelLaunch) tvm_parallel_launch_fn;
typedef __typeof__(&TVMBackendParallelBarrier) tvm_parallel_barrier_fn;
typedef __typeof__(&TVMBackendAllocWorkspace) tvm_alloc_workspace_fn;
typedef __typeof__(&TVMBackendFreeWorkspace) tvm_free_workspace_fn;

#endif /* ONNXFUSE_TVM_ABI_H */
