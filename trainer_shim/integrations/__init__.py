"""Two-line integrations: a Hugging Face ``TrainerCallback`` (``trainer_shim.integrations.hf``),
a Lightning ``Callback`` (``trainer_shim.integrations.lightning``) and a data-loader wrapper for
plain loops (``trainer_shim.integrations.loader``). Importing this package imports no framework:
each module imports its own framework only when it is imported. The names they publish are in
``trainer_shim.integrations.names``."""
