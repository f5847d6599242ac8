"""``Tagged``: the ``type`` attribute of every frame Struct.

msgspec keeps a tagged Struct's tag in its class config, not in an attribute, so a reader of
``RpcClient.events`` could not write ``event.type == "session_settled"``. This mixin gives every
frame a read-only ``type`` (the tag). It is a property, not a field: encoding, decoding,
equality and ``msgspec.structs.asdict`` are unchanged (``msgspec.to_builtins`` writes the tag as
it always did).
"""

from __future__ import annotations


class Tagged:
    __slots__ = ()

    @property
    def type(self) -> str:
        """The frame's ``type`` as it is on the wire (``"session_settled"``...)."""
        tag = self.__struct_config__.tag  # type: ignore[attr-defined]
        assert isinstance(tag, str), f"{type(self).__name__} is not a tagged Struct"
        return tag
