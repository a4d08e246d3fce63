#!/usr/bin/env python3
"""Hostile crawl of a running gpuslice: signs in as each demo role, follows
every same-site link, and sends every form and every JSON API field hostile
values (NUL, overlong, right-to-left override, invalid UTF-8, markup,
out-of-range numbers). Fails on any 5xx answer or on markup echoed back
unescaped. Standard library only.

    python3 scripts/hostile_crawl.py http://127.0.0.1:8080 [password]
"""

import http.cookiejar
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser

ROLES = [
    "admin@demo.gpuslice.dev",
    "finance@demo.gpuslice.dev",
    "pi@demo.gpuslice.dev",
    "student@demo.gpuslice.dev",
]
MARK = "<script>gpuslice-xss</script>"
# Raw (already percent-encoded) form values: NUL, invalid UTF-8, RTL
# override, markup, overlong text, numbers out of range, empty.
HOSTILE = [
    "%00",
    "a%00b",
    "%FF%FE%FD",
    "%C0%AF",
    urllib.parse.quote("\u202eevil.exe"),
    urllib.parse.quote(MARK),
    "A" * 300_000,
    "-1",
    "99999999999999999999999",
    "1e309",
    "",
]
# Forms that would end the crawl's own session or lock its accounts out
# (a password reset with a hostile but valid password succeeds).
SKIP_ACTIONS = ("/logout", "/password", "/disable")
MAX_PAGES = 400


class Page(HTMLParser):
    """Links and forms of one HTML page."""

    def __init__(self):
        super().__init__()
        self.links = []
        self.forms = []
        self._form = None
        self._select = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        for attr in ("hx-get",):
            if a.get(attr):
                self.links.append(a[attr])
        if tag == "form":
            self._form = {
                "action": a.get("action") or "",
                "method": (a.get("method") or "get").lower(),
                "fields": [],
            }
            self.forms.append(self._form)
        elif self._form is not None and tag in ("input", "textarea", "select"):
            name = a.get("name")
            if not name:
                return
            kind = (a.get("type") or "text").lower()
            if kind in ("submit", "button", "image", "file"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                value = None if kind == "checkbox" else a.get("value", "")
            else:
                value = a.get("value", "")
            field = {"name": name, "value": value, "tag": tag}
            self._form["fields"].append(field)
            if tag == "select":
                self._select = field
        elif tag == "option" and self._select is not None:
            if self._select["value"] in ("", None) or "selected" in a:
                self._select["value"] = a.get("value", "")

    def handle_endtag(self, tag):
        if tag == "form":
            self._form = None
        elif tag == "select":
            self._select = None


class Crawler:
    def __init__(self, base, email, password):
        self.base = base.rstrip("/")
        self.email = email
        self.password = password
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), NoRedirect()
        )
        self.failures = []
        self.requests = 0

    def request(self, method, path, body=None, headers=None):
        url = path if path.startswith("http") else self.base + path
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        self.requests += 1
        try:
            with self.opener.open(req, timeout=60) as r:
                return r.status, r.headers, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode("utf-8", "replace")

    def check(self, what, status, body, headers=None):
        html = headers is None or "text/html" in (headers.get("Content-Type") or "")
        if status >= 500:
            self.failures.append(f"{self.email}: {what} -> {status}: {body[:200]}")
        elif html and MARK in body:
            self.failures.append(f"{self.email}: {what} echoed markup unescaped")

    def csrf(self, body):
        m = re.search(r'name="csrf_token" value="([^"]+)"', body)
        return m.group(1) if m else ""

    def sign_in(self):
        _, _, body = self.request("GET", "/login")
        form = urllib.parse.urlencode(
            {"csrf_token": self.csrf(body), "email": self.email, "password": self.password}
        ).encode()
        status, headers, _ = self.request(
            "POST", "/login", form, {"Content-Type": "application/x-www-form-urlencoded"}
        )
        if status != 303:
            raise SystemExit(f"cannot sign in as {self.email}: {status}")

    def same_site(self, href):
        if not href or href.startswith(("#", "mailto:", "javascript:")):
            return None
        u = urllib.parse.urlsplit(urllib.parse.urljoin(self.base + "/", href))
        if f"{u.scheme}://{u.netloc}" != self.base:
            return None
        if u.path.startswith(("/static/", "/assets/")) or u.path.endswith(SKIP_ACTIONS):
            return None
        return u.path + (f"?{u.query}" if u.query else "")

    def crawl(self):
        self.sign_in()
        seen, queue, forms = set(), ["/"], {}
        while queue and len(seen) < MAX_PAGES:
            path = queue.pop(0)
            # Pages that differ only in an id are the same page to fuzz.
            shape = re.sub(r"\d+", "N", path)
            if shape in seen:
                continue
            seen.add(shape)
            status, headers, body = self.request("GET", path)
            self.check(f"GET {path}", status, body, headers)
            if status == 303 and headers.get("Location", "").startswith("/login"):
                self.sign_in()
                continue
            if "text/html" not in (headers.get("Content-Type") or ""):
                continue
            page = Page()
            page.feed(body)
            for href in page.links:
                p = self.same_site(href)
                if p:
                    queue.append(p)
            for f in page.forms:
                action = self.same_site(f["action"] or path)
                if action is None:
                    continue
                key = (f["method"], re.sub(r"\d+", "N", action.split("?")[0]),
                       tuple(x["name"] for x in f["fields"]))
                forms.setdefault(key, (action, f, path))
        for (method, _, _), (action, form, page_path) in sorted(forms.items()):
            self.fuzz_form(method, action, form, page_path)
        self.fuzz_links(seen)
        return len(seen), len(forms)

    def encode(self, fields, override=None, token=None):
        parts = []
        for f in fields:
            name = f["name"]
            if name == "csrf_token":
                value = urllib.parse.quote(token or "")
            elif override and name == override[0]:
                value = override[1]
            elif f["value"] is None:
                continue
            else:
                value = urllib.parse.quote(f["value"])
            parts.append(f"{urllib.parse.quote(name)}={value}")
        return "&".join(parts)

    def fuzz_form(self, method, action, form, page_path):
        names = [f["name"] for f in form["fields"] if f["name"] != "csrf_token"]
        for name in names:
            for raw in HOSTILE:
                # A fresh token from the page the form lives on.
                status, headers, body = self.request("GET", page_path)
                if status == 303:
                    self.sign_in()
                    status, headers, body = self.request("GET", page_path)
                token = self.csrf(body)
                data = self.encode(form["fields"], (name, raw), token)
                what = f"{method.upper()} {action} {name}={raw[:24]}"
                if method == "post":
                        s, h, b = self.request(
                        "POST", action, data.encode("latin-1"),
                        {"Content-Type": "application/x-www-form-urlencoded"},
                    )
                else:
                    sep = "&" if "?" in action else "?"
                    s, h, b = self.request("GET", action + sep + data[:8000])
                self.check(what, s, b, h)

    def fuzz_links(self, seen):
        for shape in sorted(seen):
            if "?" not in shape:
                continue
            path, query = shape.split("?", 1)
            params = [p.split("=", 1)[0] for p in query.split("&") if p]
            for name in params:
                for raw in HOSTILE:
                    if len(raw) > 8000:
                        continue
                    s, h, b = self.request("GET", f"{path}?{name}={raw}")
                    self.check(f"GET {path}?{name}={raw[:24]}", s, b, h)

    def api_token(self):
        status, _, body = self.request("GET", "/settings/tokens")
        data = urllib.parse.urlencode({"csrf_token": self.csrf(body), "name": "hostile crawl"})
        _, _, body = self.request(
            "POST", "/settings/tokens", data.encode(),
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
        m = re.search(r"gps_[A-Za-z0-9_-]+", body)
        return m.group(0) if m else None

    def fuzz_api(self):
        token = self.api_token()
        if not token:
            self.failures.append(f"{self.email}: no API token from /settings/tokens")
            return
        auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        _, _, body = self.request("GET", "/api/v1/openapi.json")
        doc = json.loads(body)
        values = ["\u0000", "a\u0000b", "\u202eevil", MARK, "A" * 300_000, -1, 10**30, 1.5, None, [], {}]
        for path, ops in doc["paths"].items():
            concrete = "/api/v1" + path.replace("{id}", "1")
            for method, op in ops.items():
                for p in op.get("parameters", []):
                    if p["in"] != "query":
                        continue
                    for v in values:
                        if isinstance(v, (list, dict)) or v is None:
                            continue
                        q = urllib.parse.urlencode({p["name"]: str(v)[:8000]})
                        s, h, b = self.request(method.upper(), f"{concrete}?{q}", None, auth)
                        self.check(f"{method.upper()} {concrete}?{p['name']}", s, b, h)
                body_schema = (op.get("requestBody") or {}).get("content", {}).get(
                    "application/json", {}).get("schema", {})
                ref = body_schema.get("$ref", "")
                schema = doc["components"]["schemas"].get(ref.split("/")[-1], body_schema)
                for branch in schema.get("oneOf", [schema]):
                    props = branch.get("properties", {})
                    base = {k: example(v) for k, v in props.items()}
                    for k in props:
                        for v in values:
                            payload = dict(base, **{k: v})
                            s, h, b = self.request(
                                method.upper(), concrete, json.dumps(payload).encode(), auth
                            )
                            self.check(f"{method.upper()} {concrete} {k}={str(v)[:24]!r}", s, b, h)
                    # Raw bytes that are not UTF-8 at all.
                    s, h, b = self.request(method.upper(), concrete, b'{"x": "\xff\xfe"}', auth)
                    self.check(f"{method.upper()} {concrete} invalid UTF-8", s, b, h)


def example(schema):
    if "enum" in schema:
        return next((e for e in schema["enum"] if e is not None), None)
    t = schema.get("type")
    t = next((x for x in t if x != "null"), "string") if isinstance(t, list) else t
    return {"integer": 1, "number": 1, "boolean": False, "array": [], "object": {}}.get(t, "x")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None

    def http_error_303(self, req, fp, code, msg, headers):
        return fp

    http_error_301 = http_error_302 = http_error_307 = http_error_308 = http_error_303


def main():
    base = sys.argv[1]
    password = sys.argv[2] if len(sys.argv) > 2 else "try gpuslice on a laptop"
    failures, total = [], 0
    for email in ROLES:
        c = Crawler(base, email, password)
        pages, forms = c.crawl()
        c.fuzz_api()
        total += c.requests
        failures += c.failures
        print(f"{email}: {pages} pages, {forms} forms, {c.requests} requests, "
              f"{len(c.failures)} failures")
    for f in failures:
        print("FAIL", f)
    print(f"hostile crawl: {total} requests, {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
