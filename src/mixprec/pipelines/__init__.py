"""Reference pipelines behind one protocol.

Three built-in pipelines show mixprec on multi-component models:

* ``tts`` - Chatterbox-shaped text to speech (Llama backbone, flow matching, HiFi-GAN);
* ``diffusion`` - Stable-Diffusion-shaped text to image (CLIP, UNet, VAE, DDIM);
* ``minilm`` - the trained all-MiniLM-L6-v2 sentence encoder.

Examples:
    ```python
    from mixprec import pipelines

    pipe = pipelines.get("tts", size="test", seed=0)
    out = pipe.run(pipe.example_inputs(batch=1, seed=0))
    out.waveform.shape, out.sample_rate

    # your own pipeline, without registering it: a factory in a module or a file
    pipe = pipelines.get("path/to/my_pipeline.py:build", size="test")
    ```

Importing this package imports neither transformers nor diffusers; each
pipeline imports them when it is built.
"""

from mixprec.pipelines._base import (
    OUTPUT_KINDS,
    AudioOutput,
    EmbeddingOutput,
    ImageOutput,
    Pipeline,
    PipelineOutput,
)
from mixprec.pipelines._factory import (
    FactoryError,
    build_factory,
    is_factory_spec,
    load_factory,
    normalize_spec,
    portable_spec,
)
from mixprec.pipelines._io import EXTENSIONS, PipelineRunError, describe, describe_all, run_to_file, write_output
from mixprec.pipelines._registry import (
    ENTRY_POINT_GROUP,
    PluginWarning,
    UnknownPipelineError,
    available,
    builtin_names,
    get,
    plugin_errors,
    refresh,
    register,
)
from mixprec.pipelines._sizes import describe_sizes, size_notes
from mixprec.pipelines._wrap import WrappedPipeline, discover_components, wrap

__all__ = [
    "ENTRY_POINT_GROUP",
    "EXTENSIONS",
    "OUTPUT_KINDS",
    "AudioOutput",
    "EmbeddingOutput",
    "FactoryError",
    "ImageOutput",
    "Pipeline",
    "PipelineOutput",
    "PluginWarning",
    "UnknownPipelineError",
    "WrappedPipeline",
    "available",
    "builtin_names",
    "build_factory",
    "describe",
    "describe_all",
    "describe_sizes",
    "discover_components",
    "get",
    "is_factory_spec",
    "load_factory",
    "normalize_spec",
    "portable_spec",
    "plugin_errors",
    "refresh",
    "register",
    "run_to_file",
    "size_notes",
    "PipelineRunError",
    "wrap",
    "write_output",
]
