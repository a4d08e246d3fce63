"""A small OpenID Connect provider for gpuslice's single sign-on tests.

It speaks the authorization code flow with PKCE (S256) as a real provider
does: discovery, JWKS, an authorize endpoint that signs in whoever the test
named (POST /_test/user) and a token endpoint that checks the client's
secret, the redirect URI, the PKCE verifier and that each code is used
once, and returns an RS256-signed ID token with the nonce it was given.
POST /_test/mode makes it misbehave the way an attacker would: "tamper"
(a changed claim under the old signature), "wrong_nonce", "wrong_audience",
"expired" (an ID token past its expiry) and "hs256" (signed with the client
secret as an HMAC key: the algorithm confusion attack).

Usage: python oidc_provider.py CLIENT_ID CLIENT_SECRET; prints its port.
"""

import base64
import hashlib
import hmac
import json
import secrets
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

CLIENT_ID, CLIENT_SECRET = sys.argv[1], sys.argv[2]
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
KID = "test-key-1"
STATE = {"user": None, "mode": "ok", "codes": {}}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def num(n: int) -> str:
    return b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


def sign(claims: dict) -> str:
    header = {"alg": "RS256", "typ": "JWT", "kid": KID}
    head = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
    sig = KEY.sign(head.encode(), padding.PKCS1v15(), hashes.SHA256())
    return head + "." + b64(sig)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def issuer(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def send_json(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/.well-known/openid-configuration":
            iss = self.issuer()
            return self.send_json(200, {
                "issuer": iss,
                "authorization_endpoint": iss + "/authorize",
                "token_endpoint": iss + "/token",
                "jwks_uri": iss + "/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                "scopes_supported": ["openid", "email", "profile"],
            })
        if url.path == "/jwks":
            pub = KEY.public_key().public_numbers()
            return self.send_json(200, {"keys": [{
                "kty": "RSA", "kid": KID, "use": "sig", "alg": "RS256",
                "n": num(pub.n), "e": num(pub.e)}]})
        if url.path == "/authorize":
            if q.get("client_id") != CLIENT_ID or q.get("response_type") != "code":
                return self.send_json(400, {"error": "invalid_request"})
            if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
                return self.send_json(400, {"error": "invalid_request", "error_description": "PKCE S256 required"})
            if "openid" not in q.get("scope", "").split():
                return self.send_json(400, {"error": "invalid_scope"})
            code = secrets.token_urlsafe(24)
            STATE["codes"][code] = {
                "nonce": q.get("nonce"), "challenge": q["code_challenge"],
                "redirect_uri": q["redirect_uri"], "user": STATE["user"], "used": False}
            target = q["redirect_uri"] + "?" + urllib.parse.urlencode({"code": code, "state": q.get("state", "")})
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_json(404, {"error": "not_found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length).decode()
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/_test/user":
            STATE["user"] = json.loads(raw)
            return self.send_json(200, {})
        if url.path == "/_test/mode":
            STATE["mode"] = json.loads(raw)["mode"]
            return self.send_json(200, {})
        if url.path != "/token":
            return self.send_json(404, {"error": "not_found"})
        form = dict(urllib.parse.parse_qsl(raw))
        client_id, secret = form.get("client_id"), form.get("client_secret")
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            pair = base64.b64decode(auth[6:]).decode()
            client_id, _, secret = pair.partition(":")
            client_id, secret = urllib.parse.unquote(client_id), urllib.parse.unquote(secret)
        if client_id != CLIENT_ID or secret != CLIENT_SECRET:
            return self.send_json(401, {"error": "invalid_client"})
        grant = STATE["codes"].get(form.get("code", ""))
        if grant is None or grant["used"]:
            return self.send_json(400, {"error": "invalid_grant", "error_description": "unknown or used code"})
        grant["used"] = True
        if form.get("redirect_uri") != grant["redirect_uri"]:
            return self.send_json(400, {"error": "invalid_grant", "error_description": "redirect_uri"})
        verifier = form.get("code_verifier", "")
        if b64(hashlib.sha256(verifier.encode()).digest()) != grant["challenge"]:
            return self.send_json(400, {"error": "invalid_grant", "error_description": "PKCE"})
        user = grant["user"]
        now = int(time.time())
        claims = {
            "iss": self.issuer(), "sub": user["sub"], "aud": CLIENT_ID,
            "iat": now, "exp": now + 300, "nonce": grant["nonce"],
            "email": user["email"], "email_verified": user.get("email_verified", True),
            "name": user.get("name", ""), "groups": user.get("groups", []),
        }
        mode = STATE["mode"]
        if mode == "wrong_nonce":
            claims["nonce"] = "not-the-nonce"
        if mode == "wrong_audience":
            claims["aud"] = "another-client"
        if mode == "expired":
            claims["iat"], claims["exp"] = now - 3600, now - 1800
        token = sign(claims)
        if mode == "hs256":
            head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": KID}).encode()) + "." + b64(json.dumps(claims).encode())
            mac = hmac.new(CLIENT_SECRET.encode(), head.encode(), hashlib.sha256).digest()
            token = head + "." + b64(mac)
        if mode == "tamper":
            # Another person's address under the original signature.
            head, _, sig = token.rsplit(".", 2)[0], None, token.rsplit(".", 1)[1]
            claims["email"] = "mallory@evil.example"
            claims["groups"] = ["gpu-admins"]
            forged = b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": KID}).encode()) + "." + b64(json.dumps(claims).encode())
            token = forged + "." + sig
        self.send_json(200, {"access_token": secrets.token_urlsafe(16), "token_type": "Bearer",
                             "expires_in": 300, "id_token": token},
                       headers=[("Cache-Control", "no-store")])


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
