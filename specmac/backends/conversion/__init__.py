"""Model files in other formats: the conversion cache (``cache``), GGUF <-> Hugging Face folder
conversion (``convert``, ``hf_to_gguf``) and the checks of a folder or hub id (``hf_check``)."""
