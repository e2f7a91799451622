/*
 * ort_host: run one ONNX model with onnxruntime's C API, with an onnxfuse kernel library
 * registered, on tensors read from files; write the outputs to files. Built for aarch64 and run
 * under qemu by tests/test_aarch64.py (see tests/aarch64/harness.py), it needs no onnxruntime
 * headers: the ABI comes from ort_abi.h / ort_host_abi.h and libonnxruntime is dlopen'ed.
 *
 * usage: ort_host LIBONNXRUNTIME MODEL [--library LIB.so] [--threads N]
 *                 [--input NAME=FILE]... [--output NAME=FILE]...
 *
 * Tensor file ("raw tensor", little-endian, written/read by harness.py):
 *   char magic[4] = "OFT1"; int32 onnx element type; int32 rank; int64 dims[rank]; data (C order).
 * Exit status: 0 ok, 1 onnxruntime error (message on stderr), 2 usage or I/O error.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ort_host_abi.h"

#define API_VERSION 17 /* RegisterCustomOpsLibrary_V2 and everything else used here */
#define MAX_TENSORS 64
#define MAX_RANK 16

static const OrtApi *api;

typedef struct {
    const char *name;
    const char *path;
} binding;

typedef struct {
    int32_t type;
    int32_t rank;
    int64_t dims[MAX_RANK];
    void *data;
    size_t bytes;
} tensor;

static void die(int code, const char *what, const char *detail) {
    fprintf(stderr, "ort_host: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(code);
}

static void check(OrtStatus *status, const char *what) {
    if (status != NULL) {
        fprintf(stderr, "ort_host: %s: %s\n", what, ORT_API_FN(api, GetErrorMessage)(status));
        ORT_API_FN(api, ReleaseStatus)(status);
        exit(1);
    }
}

static size_t element_size(int32_t type) {
    switch (type) {
    case 2: case 3: case 9: return 1;               /* uint8, int8, bool */
    case 4: case 5: case 10: case 16: return 2;     /* uint16, int16, float16, bfloat16 */
    case 1: case 6: case 12: return 4;              /* float, int32, uint32 */
    case 7: case 11: case 13: return 8;             /* int64, double, uint64 */
    default: return 0;                              /* string, complex: not supported here */
    }
}

static void read_exact(FILE *f, void *buf, size_t n, const char *path) {
    if (n && fread(buf, 1, n, f) != n) die(2, "short read", path);
}

static tensor read_tensor(const char *path) {
    tensor t = {0};
    FILE *f = fopen(path, "rb");
    if (!f) die(2, "cannot open input", path);
    char magic[4];
    read_exact(f, magic, 4, path);
    if (memcmp(magic, "OFT1", 4) != 0) die(2, "not a raw tensor file", path);
    read_exact(f, &t.type, 4, path);
    read_exact(f, &t.rank, 4, path);
    if (t.rank < 0 || t.rank > MAX_RANK) die(2, "bad rank", path);
    read_exact(f, t.dims, 8 * (size_t)t.rank, path);
    size_t count = 1;
    for (int i = 0; i < t.rank; i++) {
        if (t.dims[i] < 0) die(2, "negative dim", path);
        count *= (size_t)t.dims[i];
    }
    size_t size = element_size(t.type);
    if (size == 0) die(2, "unsupported element type", path);
    t.bytes = count * size;
    t.data = malloc(t.bytes ? t.bytes : 1);
    if (!t.data) die(2, "out of memory", path);
    read_exact(f, t.data, t.bytes, path);
    if (fgetc(f) != EOF) die(2, "trailing bytes", path);
    fclose(f);
    return t;
}

static void write_tensor(const char *path, OrtValue *value) {
    OrtTensorTypeAndShapeInfo *info;
    check(ORT_API_FN(api, GetTensorTypeAndShape)(value, &info), "GetTensorTypeAndShape");
    ONNXTensorElementDataType type;
    size_t rank, count;
    int64_t dims[MAX_RANK];
    check(ORT_API_FN(api, GetTensorElementType)(info, &type), "GetTensorElementType");
    check(ORT_API_FN(api, GetDimensionsCount)(info, &rank), "GetDimensionsCount");
    if (rank > MAX_RANK) die(2, "output rank too large", path);
    check(ORT_API_FN(api, GetDimensions)(info, dims, rank), "GetDimensions");
    check(ORT_API_FN(api, GetTensorShapeElementCount)(info, &count), "GetTensorShapeElementCount");
    ORT_API_FN(api, ReleaseTensorTypeAndShapeInfo)(info);
    size_t size = element_size(type);
    if (size == 0) die(2, "unsupported output element type", path);
    void *data;
    check(ORT_API_FN(api, GetTensorMutableData)(value, &data), "GetTensorMutableData");

    FILE *f = fopen(path, "wb");
    if (!f) die(2, "cannot create output", path);
    int32_t header[2] = {(int32_t)type, (int32_t)rank};
    if (fwrite("OFT1", 1, 4, f) != 4 || fwrite(header, 4, 2, f) != 2 || fwrite(dims, 8, rank, f) != rank ||
        (count && fwrite(data, size, count, f) != count) || fclose(f) != 0)
        die(2, "cannot write output", path);
}

static binding parse_binding(const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1]) die(2, "expected NAME=FILE", arg);
    binding b = {strndup(arg, (size_t)(eq - arg)), eq + 1};
    return b;
}

int main(int argc, char **argv) {
    if (argc < 3) die(2, "usage: ort_host LIBONNXRUNTIME MODEL [--library LIB] [--threads N] "
                         "[--input NAME=FILE]... [--output NAME=FILE]...", NULL);
    const char *ort_path = argv[1], *model_path = argv[2], *library = NULL;
    int threads = 1;
    binding inputs[MAX_TENSORS], outputs[MAX_TENSORS];
    size_t n_in = 0, n_out = 0;
    for (int i = 3; i < argc; i++) {
        if (i + 1 >= argc) die(2, "missing value after", argv[i]);
        if (!strcmp(argv[i], "--library")) library = argv[++i];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--input") && n_in < MAX_TENSORS) inputs[n_in++] = parse_binding(argv[++i]);
        else if (!strcmp(argv[i], "--output") && n_out < MAX_TENSORS) outputs[n_out++] = parse_binding(argv[++i]);
        else die(2, "unknown or repeated-too-often option", argv[i]);
    }
    if (n_out == 0) die(2, "no --output given", NULL);

    void *ort = dlopen(ort_path, RTLD_NOW | RTLD_LOCAL);
    if (!ort) die(2, "dlopen onnxruntime", dlerror());
    ort_GetApiBase_fn get_base = (ort_GetApiBase_fn)dlsym(ort, "OrtGetApiBase");
    if (!get_base) die(2, "no OrtGetApiBase in", ort_path);
    const OrtApiBase *base = get_base();
    api = base->GetApi(API_VERSION);
    if (!api) die(2, "onnxruntime too old for API version 17", base->GetVersionString());
    fprintf(stderr, "ort_host: onnxruntime %s\n", base->GetVersionString());

    OrtEnv *env;
    OrtSessionOptions *options;
    OrtSession *session;
    OrtMemoryInfo *memory;
    check(ORT_API_FN(api, CreateEnv)(ORT_LOGGING_LEVEL_ERROR, "ort_host", &env), "CreateEnv");
    check(ORT_API_FN(api, CreateSessionOptions)(&options), "CreateSessionOptions");
    check(ORT_API_FN(api, SetIntraOpNumThreads)(options, threads), "SetIntraOpNumThreads");
    if (library) check(ORT_API_FN(api, RegisterCustomOpsLibrary_V2)(options, library), "RegisterCustomOpsLibrary_V2");
    check(ORT_API_FN(api, CreateSession)(env, model_path, options, &session), "CreateSession");
    check(ORT_API_FN(api, CreateCpuMemoryInfo)(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT, &memory),
          "CreateCpuMemoryInfo");

    const char *in_names[MAX_TENSORS], *out_names[MAX_TENSORS];
    OrtValue *in_values[MAX_TENSORS], *out_values[MAX_TENSORS] = {0};
    tensor in_tensors[MAX_TENSORS];
    for (size_t i = 0; i < n_in; i++) {
        in_names[i] = inputs[i].name;
        in_tensors[i] = read_tensor(inputs[i].path);
        tensor *t = &in_tensors[i];
        check(ORT_API_FN(api, CreateTensorWithDataAsOrtValue)(memory, t->data, t->bytes, t->dims, (size_t)t->rank,
                                                             t->type, &in_values[i]),
              "CreateTensorWithDataAsOrtValue");
    }
    for (size_t i = 0; i < n_out; i++) out_names[i] = outputs[i].name;

    check(ORT_API_FN(api, Run)(session, NULL, in_names, (const OrtValue *const *)in_values, n_in, out_names, n_out,
                               out_values),
          "Run");
    for (size_t i = 0; i < n_out; i++) {
        write_tensor(outputs[i].path, out_values[i]);
        ORT_API_FN(api, ReleaseValue)(out_values[i]);
    }
    for (size_t i = 0; i < n_in; i++) {
        ORT_API_FN(api, ReleaseValue)(in_values[i]);
        free(in_tensors[i].data);
    }
    ORT_API_FN(api, ReleaseMemoryInfo)(memory);
    ORT_API_FN(api, ReleaseSession)(session);
    ORT_API_FN(api, ReleaseSessionOptions)(options);
    ORT_API_FN(api, ReleaseEnv)(env);
    return 0;
}
