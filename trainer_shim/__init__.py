"""dflash-sidecar's trainer shim: publish cheap CPU-side telemetry without costing the GPU.

Import light: pyzmq and msgspec only; torch and wandb are used only if the trainer imported them.
"""

__version__ = "0.2.0"
