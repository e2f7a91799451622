/*
 * How a TVM-compiled kernel is called, and what it expects from its host, declared by the project.
 *
 * Why our own header: the library runs kernels with no TVM installed, and needs only the calling
 * convention. Written from TVM 0.27's documented layouts (tvm-ffi's TVMFFIAny, DLPack's DLTensor,
 * c_backend_api.h's parallel-launch contract) as summarised in /work/shared/notes/tvm-0.27.md.
 *
 * A kernel object defines `int __tvm_ffi_<name>(void *self, const TVMFFIAny *args, int32_t n,
 * TVMFFIAny *ret)`, taking one DLTensor pointer per tensor (inputs, then outputs). It returns 0,
 * or -1 after reporting the error through TVMFFIErrorSetRaisedFromCStrParts, which the host
 * defines. Hooks it may call (__TVMBackendParallelLaunch, ...) are DATA symbols holding function
 * pointers that the host fills before the first call.
 */
#ifndef ONNXFUSE_TVM_ABI_H
#define ONNXFUSE_TVM_ABI_H

#include <stdint.h>

/* ---- DLPack tensors ------------------------------------------------------------------------ */
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BOOL = 6 }; /* DLDataType.code */
enum { DL_CPU = 1 };                                       /* DLDevice.device_type */

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* NULL = compact row-major */
    uint64_t byte_offset;
} DLTensor;

/* ---- tvm-ffi packed arguments ------------------------------------------------------------- */
enum { TVM_FFI_NONE = 0, TVM_FFI_DLTENSOR_PTR = 7 }; /* TVMFFIAny.type_index */

typedef struct {
    int32_t type_index;
    uint32_t zero_padding;
    union {
        int64_t v_int64;
        double v_float64;
        void *v_ptr;
    };
} TVMFFIAny;

_Static_assert(sizeof(TVMFFIAny) == 16, "TVMFFIAny is 16 bytes");

typedef int (*tvm_kernel_fn)(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *ret);

/* The error hook every kernel references; the host defines it. */
void TVMFFIErrorSetRaisedFromCStrParts(const char *kind, const char **parts, int32_t num_parts);

/* ---- Backend hooks (the host fills the kernels' data symbols with these types) ------------ */
typedef struct {
    void *sync_handle; /* unused by this host */
    int32_t num_task;
} TVMParallelGroupEnv;

/* One task of a parallel loop: runs the share `task_id` of `penv->num_task`; 0 or -1. */
typedef int (*tvm_parallel_lambda)(int task_id, TVMParallelGroupEnv *penv, void *cdata);

/* num_task 0 means "as many as the host likes". Returns 0, or -1 if any task failed. */
typedef int (*tvm_parallel_launch_fn)(tvm_parallel_lambda lambda, void *cdata, int num_task);
typedef int (*tvm_parallel_barrier_fn)(int task_id, TVMParallelGroupEnv *penv);
typedef void *(*tvm_alloc_workspace_fn)(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint,
                                        int dtype_bits_hint);
typedef int (*tvm_free_workspace_fn)(int device_type, int device_id, void *ptr);

#endif /* ONNXFUSE_TVM_ABI_H */
