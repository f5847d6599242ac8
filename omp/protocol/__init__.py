"""The wire: msgspec types for every frame, and sans-I/O framing and codec.

Nothing in this package awaits or touches a file descriptor: bytes go in, frames (or "need more
data") come out; frames go in, bytes come out. It imports nothing else of ``omp``.

Conventions every wire type follows:

* Structs are frozen, ``kw_only`` and ``omit_defaults=True``: an optional field whose value equals
  its default is left out of the JSON, so absent never becomes ``null``. Where the protocol really
  writes ``null`` the field's type includes ``None`` *and* its default is something else (usually
  ``msgspec.UNSET``), so ``None`` is written.
* Tagged unions use ``tag_field="type"`` with the protocol's own names as tags.
* Field names are the protocol's (camelCase) so encoding needs no renaming pass.
"""
