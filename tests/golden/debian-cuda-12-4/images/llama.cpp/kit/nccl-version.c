/* kit-nccl-version: print the version of the NCCL that the dynamic loader resolves for libnccl.so.2.
 * It calls ncclGetVersion, which needs no GPU, so the build and `kit verify` can prove the pin without one.
 * usage: kit-nccl-version [LIBRARY]   (default libnccl.so.2, resolved exactly as an engine would) */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    const char *lib = argc > 1 ? argv[1] : "libnccl.so.2";
    void *handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        fprintf(stderr, "kit-nccl-version: cannot load %s: %s\n", lib, dlerror());
        return 2;
    }
    int (*get_version)(int *) = (int (*)(int *))dlsym(handle, "ncclGetVersion");
    int code = 0;
    if (!get_version || get_version(&code) != 0) {
        fprintf(stderr, "kit-nccl-version: ncclGetVersion failed in %s\n", lib);
        return 3;
    }
    /* nccl.h: below 2.9 the code is major*1000 + minor*100 + patch, from 2.9 on major*10000 + minor*100 + patch */
    int major = code >= 10000 ? code / 10000 : code / 1000;
    int rest = code >= 10000 ? code % 10000 : code % 1000;
    printf("%d.%d.%d\n", major, rest / 100, rest % 100);
    return 0;
}
