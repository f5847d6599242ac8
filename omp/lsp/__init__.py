"""Language servers for the ``lsp`` tool (docs/guides/tools.md#language-servers).

``framing`` splits a server's stdout into messages (sans-IO: ``Content-Length`` headers,
linear, bounded); ``client`` is one server process and the JSON-RPC spoken to it, with the
types of ``lsprotocol``; ``servers`` knows which server serves which file and keeps one per
language and workspace, started on first use in the session's helper nursery; ``edits``
applies a server's workspace edit to the files. Nothing here is imported before the tool's
first call.
"""
