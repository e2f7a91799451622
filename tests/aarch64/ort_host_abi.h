/*
 * The host-side slice of the onnxruntime C API that the test host (ort_host.c) uses, on top of
 * the project's own onnxfuse/runtime/ort_abi.h (which declares the custom-op side and the
 * ORT_API_FN slot mechanism): the same slot table (docs/runtime.md), with the session, env and
 * tensor entries a program that *runs* a model needs.
 */
#ifndef ONNXFUSE_ORT_HOST_ABI_H
#define ONNXFUSE_ORT_HOST_ABI_H

#include "ort_abi.h"

typedef struct OrtEnv OrtEnv;
typedef struct OrtSession OrtSession;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtMemoryInfo OrtMemoryInfo;

typedef enum { ORT_LOGGING_LEVEL_WARNING = 2, ORT_LOGGING_LEVEL_ERROR = 3 } OrtLoggingLevel;
typedef enum { ORT_ARENA_ALLOCATOR = 1 } OrtAllocatorType;

/* The one symbol a host takes from libonnxruntime. */
typedef const OrtApiBase *(*ort_GetApiBase_fn)(void);

#define ORT_SLOT_CreateEnv 3
typedef OrtStatus *(*ort_CreateEnv_fn)(OrtLoggingLevel level, const char *log_id, OrtEnv **out);
#define ORT_SLOT_CreateSession 7
typedef OrtStatus *(*ort_CreateSession_fn)(const OrtEnv *env, const char *model_path,
                                           const OrtSessionOptions *options, OrtSession **out);
#define ORT_SLOT_Run 9
typedef OrtStatus *(*ort_Run_fn)(OrtSession *session, const OrtRunOptions *run_options,
                                 const char *const *input_names, const OrtValue *const *inputs, size_t input_count,
                                 const char *const *output_names, size_t output_count, OrtValue **outputs);
#define ORT_SLOT_CreateSessionOptions 10
typedef OrtStatus *(*ort_CreateSessionOptions_fn)(OrtSessionOptions **out);
#define ORT_SLOT_SetIntraOpNumThreads 24
typedef OrtStatus *(*ort_SetIntraOpNumThreads_fn)(OrtSessionOptions *options, int threads);
#define ORT_SLOT_CreateTensorWithDataAsOrtValue 49
typedef OrtStatus *(*ort_CreateTensorWithDataAsOrtValue_fn)(const OrtMemoryInfo *info, void *data, size_t data_bytes,
                                                            const int64_t *shape, size_t rank,
                                                            ONNXTensorElementDataType type, OrtValue **out);
#define ORT_SLOT_GetTensorShapeElementCount 64
typedef OrtStatus *(*ort_GetTensorShapeElementCount_fn)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
#define ORT_SLOT_CreateCpuMemoryInfo 69
typedef OrtStatus *(*ort_CreateCpuMemoryInfo_fn)(OrtAllocatorType type, OrtMemType mem_type, OrtMemoryInfo **out);
#define ORT_SLOT_ReleaseEnv 92
typedef void (*ort_ReleaseEnv_fn)(OrtEnv *env);
#define ORT_SLOT_ReleaseMemoryInfo 94
typedef void (*ort_ReleaseMemoryInfo_fn)(OrtMemoryInfo *info);
#define ORT_SLOT_ReleaseSession 95
typedef void (*ort_ReleaseSession_fn)(OrtSession *session);
#define ORT_SLOT_ReleaseValue 96
typedef void (*ort_ReleaseValue_fn)(OrtValue *value);
#define ORT_SLOT_ReleaseSessionOptions 100
typedef void (*ort_ReleaseSessionOptions_fn)(OrtSessionOptions *options);
#define ORT_SLOT_RegisterCustomOpsLibrary_V2 228
typedef OrtStatus *(*ort_RegisterCustomOpsLibrary_V2_fn)(OrtSessionOptions *options, const char *library_path);

#endif /* ONNXFUSE_ORT_HOST_ABI_H */
