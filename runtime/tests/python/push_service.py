"""A stand-in Web Push service for the broker's tests, on 127.0.0.1 (random port).

It plays both ends a browser relies on: `POST /new` makes a subscription the way a browser
does (a fresh P-256 key pair and auth secret, returned as the JSON `PushManager.subscribe`
gives), and `POST /push/<n>` receives a push for it the way a push service does: it checks the
VAPID authorization (RFC 8292: the ES256 signature over the JWT with the key in `k=`, the
audience, the expiry, the subject), decrypts the body with the subscription's private key
(RFC 8291, `aes128gcm`), and prints one JSON line per push on stdout. The answer is the status
the subscription was made with (`{"status": 410}` to play a subscription that is gone).

The first line on stdout is `{"port": N}`.
"""

import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

LOCK = threading.Lock()
SUBS = {}  # n -> {"key": private key, "public": bytes, "auth": bytes, "status": int}


def b64d(s):
    s = s.strip()
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def b64e(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def hkdf(salt, ikm, info, length):
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def check_vapid(header, origin):
    """The claims of a valid `vapid t=..., k=...` header for `origin`, else an exception."""
    if not header.startswith("vapid "):
        raise ValueError(f"authorization is not vapid: {header!r}")
    params = dict(p.strip().split("=", 1) for p in header[len("vapid "):].split(","))
    token, key = params["t"], b64d(params["k"])
    head, claims, sig = token.split(".")
    if json.loads(b64d(head)) != {"typ": "JWT", "alg": "ES256"}:
        raise ValueError(f"bad JWT header {b64d(head)!r}")
    sig = b64d(sig)
    if len(sig) != 64:
        raise ValueError(f"ES256 signature of {len(sig)} bytes")
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), key)
    der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
    try:
        public.verify(der, f"{head}.{claims}".encode(), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise ValueError("the JWT signature does not verify with k")
    claims = json.loads(b64d(claims))
    if claims.get("aud") != origin:
        raise ValueError(f"aud {claims.get('aud')!r}, expected {origin!r}")
    left = claims["exp"] - time.time()
    if not 0 < left <= 24 * 3600:
        raise ValueError(f"exp is {left:.0f} s away")
    if not str(claims.get("sub", "")).startswith(("mailto:", "https:")):
        raise ValueError(f"sub {claims.get('sub')!r}")
    return claims, b64e(key)


def decrypt(sub, body):
    """RFC 8291 / RFC 8188 aes128gcm: one record, delimiter 0x02."""
    salt, rs, idlen = body[:16], int.from_bytes(body[16:20], "big"), body[20]
    server_public = body[21:21 + idlen]
    ciphertext = body[21 + idlen:]
    if idlen != 65 or len(ciphertext) > rs:
        raise ValueError(f"bad header: idlen {idlen}, rs {rs}, {len(ciphertext)} bytes")
    peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), server_public)
    secret = sub["key"].exchange(ec.ECDH(), peer)
    ikm = hkdf(sub["auth"], secret, b"WebPush: info\0" + sub["public"] + server_public, 32)
    cek = hkdf(salt, ikm, b"Content-Encoding: aes128gcm\0", 16)
    nonce = hkdf(salt, ikm, b"Content-Encoding: nonce\0", 12)
    plain = AESGCM(cek).decrypt(nonce, ciphertext, None).rstrip(b"\0")
    if not plain.endswith(b"\x02"):
        raise ValueError("the record does not end with the last-record delimiter")
    return json.loads(plain[:-1])


def emit(obj):
    with LOCK:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, obj=None):
        data = json.dumps(obj).encode() if obj is not None else b""
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        port = self.server.server_address[1]
        if self.path == "/new":
            opts = json.loads(body or b"{}")
            key = ec.generate_private_key(ec.SECP256R1())
            public = key.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
            auth = os.urandom(16)
            with LOCK:
                n = len(SUBS) + 1
                SUBS[n] = {"key": key, "public": public, "auth": auth,
                           "status": opts.get("status", 201)}
            return self.answer(200, {
                "endpoint": f"http://127.0.0.1:{port}/push/{n}",
                "keys": {"p256dh": b64e(public), "auth": b64e(auth)},
            })
        if self.path.startswith("/push/"):
            n = int(self.path[len("/push/"):])
            sub = SUBS.get(n)
            if sub is None:
                return self.answer(404, {"error": "unknown subscription"})
            record = {"sub": n, "ttl": self.headers.get("ttl"),
                      "urgency": self.headers.get("urgency"),
                      "encoding": self.headers.get("content-encoding")}
            try:
                claims, k = check_vapid(self.headers.get("authorization", ""),
                                        f"http://127.0.0.1:{port}")
                record["vapid"] = {"sub": claims["sub"], "k": k}
                record["payload"] = decrypt(sub, body)
            except Exception as e:  # reported to the test, which fails on it
                record["error"] = f"{type(e).__name__}: {e}"
            emit(record)
            return self.answer(sub["status"], None)
        self.answer(404, {"error": "no such route"})


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    emit({"port": server.server_address[1]})
    server.serve_forever()


if __name__ == "__main__":
    main()
