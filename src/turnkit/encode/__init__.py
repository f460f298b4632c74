"""Encoding conversations to token ids: safe by default, with loss masks for any template.

* :mod:`.options`: everything an encode takes besides the messages;
* :mod:`.encoder`: the pipeline, stage by stage, one conversation or a pipelined batch; its stages:
* :mod:`.job`: stage 1, a conversation checked, prepared and rendered with provenance;
* :mod:`.marking`: breaking control-token strings in data, tagging data with its source;
* :mod:`.controls`: the template's control tokens in a render, the id-count invariant, markers the tokenizer lacks;
* :mod:`.tokenize`: rendered text to ids (cut at control tokens, pieces cached);
* :mod:`.coverage`: what the render holds of each assistant turn (a trained turn whose data the template leaves out
  is refused);
* :mod:`.attribution`: which message and which source each token belongs to;
* :mod:`.masks`: which tokens are trained; :mod:`.history`: renders of the conversation cut short (headers, prefix
  stability) that masks need;
* :mod:`.prefix`: prefix stability and train-vs-serve prompt diffs;
* :mod:`.encoding`: the result.

The tokenizer it encodes with lives in :mod:`turnkit.tokenizer`; its errors in :mod:`turnkit.errors`.
"""

from turnkit.encode.encoder import Encoder
from turnkit.encode.encoding import IGNORE_INDEX, Encoding
from turnkit.encode.options import EncodeOptions
from turnkit.errors import (
    DroppedDataError,
    EmptyMaskError,
    EncodeError,
    MissingControlTokenWarning,
    TokenizerError,
    TrustedDataWarning,
)

__all__ = [
    "IGNORE_INDEX",
    "DroppedDataError",
    "EmptyMaskError",
    "EncodeError",
    "EncodeOptions",
    "Encoder",
    "Encoding",
    "MissingControlTokenWarning",
    "TokenizerError",
    "TrustedDataWarning",
]
