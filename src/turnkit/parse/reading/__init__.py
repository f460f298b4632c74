"""Reading a reply: token ids (or text) to an assistant message and its deltas, incrementally while streaming.

* :mod:`.parser`: the push parser (:class:`~.parser.StreamParser`), ids in, deltas out; :mod:`.prompt`: a parser set
  up for one request's prompt and stops; :mod:`.detokenize`: ids to text in constant time per token;
* :mod:`.machine`: the one machine that runs every format, a driver over its collaborators. Where the reading stands
  is a type (:mod:`.modes`: one class per mode, holding its own data); the code that reads a mode returns the next,
  and the machine alone assigns it;
* :mod:`.compiled`: the format in symbol space; :mod:`.lexer`: needles across token boundaries, with hold-back;
  :mod:`.needles`: what each mode looks for; :mod:`.state`: what the collaborators share, and the deltas out;
* a call's elements: :mod:`.walk` and :mod:`.candidates` (literals and holes), :mod:`.callstate` (the call being
  read), :mod:`.arguments` and :mod:`.params` (the arguments, by their encoding's row), :mod:`.headers` (Harmony's
  headers).
"""
