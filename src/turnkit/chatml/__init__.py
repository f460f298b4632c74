"""``turnkit add-chatml``: give a base model the ChatML format, verified (layer 7; stands on doctor).

* :func:`add_chatml` changes transformers objects you already hold (:mod:`~turnkit.chatml.convert`).
* :func:`add_chatml_to_folder` converts a model folder into a new one and audits it (:mod:`~turnkit.chatml.folder`).
* :func:`chatml_template` is the template both write (:mod:`~turnkit.chatml.template`).

torch and transformers are imported only when a conversion runs.
"""

from turnkit.chatml.convert import ChatMLChanges, add_chatml
from turnkit.chatml.folder import LORA_FILE, FolderResult, add_chatml_to_folder
from turnkit.chatml.template import IM_END, IM_START, chatml_template
from turnkit.chatml.tokens import TokenChanges
from turnkit.chatml.weights import WeightChanges

__all__ = [
    "IM_END",
    "IM_START",
    "LORA_FILE",
    "ChatMLChanges",
    "FolderResult",
    "TokenChanges",
    "WeightChanges",
    "add_chatml",
    "add_chatml_to_folder",
    "chatml_template",
]
