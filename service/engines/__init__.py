"""Generation engines: `local` (embedded PyTorch) and `vllm`; bundled model names and
paths: :mod:`service.model_paths`."""
