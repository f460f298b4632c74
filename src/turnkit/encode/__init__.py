"""Encoding conversations to token ids: safe by default, with loss masks for any template.

* :mod:`.tokenizer`: the checkpoint's tokenizer and a twin with every added token disabled;
* :mod:`.marking`: breaking control-token strings in data, tagging data with its source;
* :mod:`.encoder`: the encoding pipeline (render with provenance, tokenize, check, attribute, mask);
* :mod:`.encoding`: the result.
"""

from turnkit.encode.encoder import EmptyMaskError, EncodeError, EncodeOptions, Encoder, TrustedDataWarning
from turnkit.encode.encoding import IGNORE_INDEX, Encoding
from turnkit.encode.tokenizer import TokenizerBinding, TokenizerError

__all__ = [
    "IGNORE_INDEX",
    "EmptyMaskError",
    "EncodeError",
    "EncodeOptions",
    "Encoder",
    "Encoding",
    "TokenizerBinding",
    "TokenizerError",
    "TrustedDataWarning",
]
