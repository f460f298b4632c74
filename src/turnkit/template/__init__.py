"""Chat templates: where they come from (:mod:`.sources`), the sandbox they run in (:mod:`.sandbox`), the time
limit (:mod:`.watchdog`), tools as schemas (:mod:`.tools`) and the renderer itself (:mod:`.render`)."""

from turnkit.template.render import Rendered, RenderLimits, render_template
from turnkit.template.sources import TemplateSet, load_gguf, load_hf_folder
from turnkit.template.tools import function_schema

__all__ = [
    "RenderLimits",
    "Rendered",
    "TemplateSet",
    "function_schema",
    "load_gguf",
    "load_hf_folder",
    "render_template",
]
