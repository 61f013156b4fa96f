"""kit: fail the build when the installed torch has no kernels for the configured GPUs.

torch._C._cuda_getArchFlags() is the arch list torch was compiled with (what torch.cuda.get_arch_list() splits);
it needs no GPU. usage: python torch-archs.py sm_70 [sm_80 ...]
"""

import sys

import torch

want = sys.argv[1:]
flags = (torch._C._cuda_getArchFlags() or "").split()
missing = [arch for arch in want if arch not in flags]
if missing:
    print(f"kit: torch {torch.__version__} was built for {' '.join(flags) or 'no CUDA arch'}, not "
          f"{' '.join(missing)}: pick a torch whose wheels still carry it (engines.vllm.torch / torch_variant)",
          file=sys.stderr)
    sys.exit(1)
print(f"kit: torch {torch.__version__} carries {' '.join(want)} ({' '.join(flags)})")
