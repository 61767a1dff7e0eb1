"""uvicorn's httptools protocol with its own 400 in the OpenAI error shape.

A request that httptools cannot parse (a malformed request line or header, a bad
Content-Length or chunk size) never reaches the app: uvicorn answers it itself, in plain
text. This protocol answers the same 400, closing the connection as uvicorn does, with the
body every other error has. What the kernel or the parser refuses before a request exists
(a full listen backlog, a dropped connection) gets no HTTP answer at all.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from daemon.http.errors import bad_request


class OpenAIErrorsHttpTools(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        body = bad_request(f"{msg} The request is not valid HTTP/1.1 (its request line, a "
                           "header or its framing).").body()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n",
                 b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                 b"connection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
