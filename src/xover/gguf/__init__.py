"""GGUF models: shape arithmetic (:mod:`.shapes`, pure), named shapes (:mod:`.presets`), synthetic model
writing (:mod:`.synth`) and inspection of any GGUF file (:mod:`.inspect`)."""
