"""The TorchX backend: the job as an AppDef, through any TorchX scheduler."""
