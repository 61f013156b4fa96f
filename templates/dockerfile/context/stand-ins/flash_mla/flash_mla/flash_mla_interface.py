"""kit's stand-in for FlashMLA's interface, in a build for GPUs older than sm_90a: FlashMLA has no kernels for them,
so vllm._flashmla_C was not built and vLLM (vllm/v1/attention/ops/flashmla.py) never imports this module."""

raise ImportError("FlashMLA was not built: its kernels need sm_90a or newer (kit's stand-in)")
