"""A template's reply format, chosen by rendering: what the template writes decides, never what its text mentions.

* :mod:`.select`: the choice (a family's declared format, else the first catalog format that reads back every probe
  the template writes, else one derived from the renders), with its reasons;
* :mod:`.probes`: the probe messages and tools rendered through the template;
* :mod:`.derive`: a format read off the renders themselves, with :mod:`.markers` (marker shapes), :mod:`.locate`
  (where the probe calls landed) and :mod:`.toolsyntax` (the tool syntax built from the text around them).

It sits above :mod:`turnkit.parse.reading` because a candidate is kept only if reading the probe renders with it
gives the probes back.
"""
