/*
 * The part of the onnxruntime custom-op C ABI that onnxfuse uses, declared by the project.
 *
 * Why our own header: no package we can install ships onnxruntime's C headers, and a custom-op
 * library only needs a small, stable slice of the ABI (slot indices checked with offsetof against
 * ORT 1.29's public header, exercised on 1.30 and 1.31; docs/runtime.md says which API version
 * the library asks for and why newer releases keep working).
 *
 * OrtApi is a table of function pointers that only grows at the end, so a function is reached by
 * its fixed slot index: ORT_API_FN(api, Name) reads slot ORT_SLOT_Name as an ort_Name_fn (all
 * function pointers have one size, so slot i sits at i * sizeof(void *)). We never link against
 * libonnxruntime: the table arrives through OrtApiBase at registration.
 */
#ifndef ONNXFUSE_ORT_ABI_H
#define ONNXFUSE_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ---- Opaque handles (ORT owns their layouts) ---------------------------------------------- */
typedef struct OrtApi OrtApi; /* a table of pointer-sized slots, see ORT_API_FN */
typedef struct OrtStatus OrtStatus;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtShapeInferContext OrtShapeInferContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
struct OrtCustomOp; /* defined below */

/* ---- Enums ---------------------------------------------------------------------------------- */
typedef enum {
    ORT_OK = 0,
    ORT_FAIL = 1,
    ORT_INVALID_ARGUMENT = 2,
    ORT_RUNTIME_EXCEPTION = 6,
} OrtErrorCode;

/* The ONNX TensorProto element-type codes; the values of ONNXTensorElementDataType. */
typedef int ONNXTensorElementDataType;

typedef enum {
    ORT_INPUT_OUTPUT_REQUIRED = 0,
    ORT_INPUT_OUTPUT_OPTIONAL = 1,
    ORT_INPUT_OUTPUT_VARIADIC = 2,
} OrtCustomOpInputOutputCharacteristic;

typedef enum { ORT_MEM_TYPE_DEFAULT = 0 } OrtMemType;

/* ---- Entry point -------------------------------------------------------------------------- */
typedef struct OrtApiBase {
    const OrtApi *(*GetApi)(uint32_t version); /* NULL if `version` is newer than the runtime */
    const char *(*GetVersionString)(void);
} OrtApiBase;

/* ---- OrtApi slots, by index ---------------------------------------------------------------- */
#define ORT_API_FN(api, NAME) (((const ort_##NAME##_fn *)(const void *)(api))[ORT_SLOT_##NAME])

#define ORT_SLOT_CreateStatus 0
typedef OrtStatus *(*ort_CreateStatus_fn)(OrtErrorCode code, const char *message);
#define ORT_SLOT_GetErrorMessage 2
typedef const char *(*ort_GetErrorMessage_fn)(const OrtStatus *status);
#define ORT_SLOT_CreateCustomOpDomain 26
typedef OrtStatus *(*ort_CreateCustomOpDomain_fn)(const char *domain, OrtCustomOpDomain **out);
#define ORT_SLOT_CustomOpDomain_Add 27
typedef OrtStatus *(*ort_CustomOpDomain_Add_fn)(OrtCustomOpDomain *domain, const struct OrtCustomOp *op);
#define ORT_SLOT_AddCustomOpDomain 28
typedef OrtStatus *(*ort_AddCustomOpDomain_fn)(OrtSessionOptions *options, OrtCustomOpDomain *domain);
#define ORT_SLOT_GetTensorMutableData 51
typedef OrtStatus *(*ort_GetTensorMutableData_fn)(OrtValue *value, void **out);
#define ORT_SLOT_CreateTensorTypeAndShapeInfo 57
typedef OrtStatus *(*ort_CreateTensorTypeAndShapeInfo_fn)(OrtTensorTypeAndShapeInfo **out);
#define ORT_SLOT_SetTensorElementType 58
typedef OrtStatus *(*ort_SetTensorElementType_fn)(OrtTensorTypeAndShapeInfo *info, ONNXTensorElementDataType type);
#define ORT_SLOT_SetDimensions 59
typedef OrtStatus *(*ort_SetDimensions_fn)(OrtTensorTypeAndShapeInfo *info, const int64_t *dims, size_t count);
#define ORT_SLOT_GetTensorElementType 60
typedef OrtStatus *(*ort_GetTensorElementType_fn)(const OrtTensorTypeAndShapeInfo *info, ONNXTensorElementDataType *out);
#define ORT_SLOT_GetDimensionsCount 61
typedef OrtStatus *(*ort_GetDimensionsCount_fn)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
#define ORT_SLOT_GetDimensions 62
typedef OrtStatus *(*ort_GetDimensions_fn)(const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t count);
#define ORT_SLOT_GetSymbolicDimensions 63
typedef OrtStatus *(*ort_GetSymbolicDimensions_fn)(const OrtTensorTypeAndShapeInfo *info, const char **names, size_t count);
#define ORT_SLOT_GetTensorTypeAndShape 65
typedef OrtStatus *(*ort_GetTensorTypeAndShape_fn)(const OrtValue *value, OrtTensorTypeAndShapeInfo **out);
#define ORT_SLOT_KernelContext_GetInputCount 88
typedef OrtStatus *(*ort_KernelContext_GetInputCount_fn)(const OrtKernelContext *ctx, size_t *out);
#define ORT_SLOT_KernelContext_GetOutputCount 89
typedef OrtStatus *(*ort_KernelContext_GetOutputCount_fn)(const OrtKernelContext *ctx, size_t *out);
#define ORT_SLOT_KernelContext_GetInput 90
typedef OrtStatus *(*ort_KernelContext_GetInput_fn)(const OrtKernelContext *ctx, size_t index, const OrtValue **out);
#define ORT_SLOT_KernelContext_GetOutput 91
typedef OrtStatus *(*ort_KernelContext_GetOutput_fn)(OrtKernelContext *ctx, size_t index, const int64_t *dims,
                                                     size_t count, OrtValue **out);
#define ORT_SLOT_ReleaseStatus 93
typedef void (*ort_ReleaseStatus_fn)(OrtStatus *status);
#define ORT_SLOT_ReleaseTensorTypeAndShapeInfo 99
typedef void (*ort_ReleaseTensorTypeAndShapeInfo_fn)(OrtTensorTypeAndShapeInfo *info);
/* is_constant becomes 1 when input `index` is a constant initializer (one no feed can override);
 * *out is then its value, owned by the session (API 15+). */
#define ORT_SLOT_KernelInfoGetConstantInput_tensor 249
typedef OrtStatus *(*ort_KernelInfoGetConstantInput_tensor_fn)(const OrtKernelInfo *info, size_t index, int *is_constant,
                                                               const OrtValue **out);
#define ORT_SLOT_ShapeInferContext_GetInputCount 267
typedef OrtStatus *(*ort_ShapeInferContext_GetInputCount_fn)(const OrtShapeInferContext *ctx, size_t *out);
/* The returned info is owned by the context: do not release it. */
#define ORT_SLOT_ShapeInferContext_GetInputTypeShape 268
typedef OrtStatus *(*ort_ShapeInferContext_GetInputTypeShape_fn)(const OrtShapeInferContext *ctx, size_t index,
                                                                 OrtTensorTypeAndShapeInfo **out);
#define ORT_SLOT_ShapeInferContext_SetOutputTypeShape 270
typedef OrtStatus *(*ort_ShapeInferContext_SetOutputTypeShape_fn)(const OrtShapeInferContext *ctx, size_t index,
                                                                  const OrtTensorTypeAndShapeInfo *info);
#define ORT_SLOT_SetSymbolicDimensions 271
typedef OrtStatus *(*ort_SetSymbolicDimensions_fn)(OrtTensorTypeAndShapeInfo *info, const char **names, size_t count);
/* Runs fn(user, i) for i in [0, total) on the session's intra-op pool (API 17+). */
#define ORT_SLOT_KernelContext_ParallelFor 274
typedef OrtStatus *(*ort_KernelContext_ParallelFor_fn)(const OrtKernelContext *ctx, void (*fn)(void *user, size_t i),
                                                       size_t total, size_t num_batch, void *user);

/* The element type and dims of a tensor without allocating (the dims stay owned by the value):
 * API 24+ (onnxruntime 1.24), the last slot that version added. Used only where GetApi(24) says
 * the running onnxruntime has it; older ones take GetTensorTypeAndShape, which allocates. */
#define ORT_SLOT_GetTensorElementTypeAndShapeDataReference 414
typedef OrtStatus *(*ort_GetTensorElementTypeAndShapeDataReference_fn)(const OrtValue *value,
                                                                        ONNXTensorElementDataType *type,
                                                                        const int64_t **dims, size_t *count);
#define ORT_API_VERSION_SHAPE_REFERENCE 24

/* The oldest API with every slot above but the optional one (onnxruntime 1.17). GetApi(v) hands
 * any runtime that knows v the same table, which only ever grows, so asking for the oldest one we
 * need is what keeps newer releases working. */
#define ORT_API_VERSION_NEEDED 17

/* ---- OrtCustomOp: what the library hands ORT per operator -------------------------------- */
/* Every field is pointer-sized (`version` is padded to 8 bytes): 26 slots, 208 bytes on LP64. */
typedef struct OrtCustomOp {
    uint32_t version; /* ORT reads only the fields this version has (17: through GetEndVersion) */
    void *(*CreateKernel)(const struct OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info);
    const char *(*GetName)(const struct OrtCustomOp *op);
    const char *(*GetExecutionProviderType)(const struct OrtCustomOp *op); /* NULL = CPU */
    ONNXTensorElementDataType (*GetInputType)(const struct OrtCustomOp *op, size_t index);
    size_t (*GetInputTypeCount)(const struct OrtCustomOp *op);
    ONNXTensorElementDataType (*GetOutputType)(const struct OrtCustomOp *op, size_t index);
    size_t (*GetOutputTypeCount)(const struct OrtCustomOp *op);
    void (*KernelCompute)(void *kernel, OrtKernelContext *ctx);
    void (*KernelDestroy)(void *kernel);
    OrtCustomOpInputOutputCharacteristic (*GetInputCharacteristic)(const struct OrtCustomOp *op, size_t index);
    OrtCustomOpInputOutputCharacteristic (*GetOutputCharacteristic)(const struct OrtCustomOp *op, size_t index);
    OrtMemType (*GetInputMemoryType)(const struct OrtCustomOp *op, size_t index);
    int (*GetVariadicInputMinArity)(const struct OrtCustomOp *op);
    int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp *op);
    int (*GetVariadicOutputMinArity)(const struct OrtCustomOp *op);
    int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp *op);
    OrtStatus *(*CreateKernelV2)(const struct OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                 void **kernel);
    OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *ctx);
    OrtStatus *(*InferOutputShapeFn)(const struct OrtCustomOp *op, OrtShapeInferContext *ctx);
    int (*GetStartVersion)(const struct OrtCustomOp *op);
    int (*GetEndVersion)(const struct OrtCustomOp *op);
    size_t (*GetMayInplace)(int **input_index, int **output_index);
    void (*ReleaseMayInplace)(int *input_index, int *output_index);
    size_t (*GetAliasMap)(int **input_index, int **output_index);
    void (*ReleaseAliasMap)(int *input_index, int *output_index);
} OrtCustomOp;

_Static_assert(sizeof(OrtCustomOp) == 26 * sizeof(void *), "OrtCustomOp must be 26 pointer-sized slots");

#endif /* ONNXFUSE_ORT_ABI_H */
