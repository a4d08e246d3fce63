#!/usr/bin/env python3
"""Renders deploy/helm/gpuslice the way `helm template` does, for machines
without helm: the chart's templates use a small part of Go's template
language (values, if/else/end with and/or/not, range over maps and lists,
and the functions quote, default, printf, toYaml, nindent, indent and
.Files.Get), and this implements exactly that part. Anything else in a
template is an error, never silently passed through.

Usage: render_chart.py CHART_DIR [RELEASE_NAME] [-f values.yaml]... > out.yaml
"""

import json
import os
import re
import sys

import yaml

TOKEN = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)


def lex(text):
    """Text and actions, with Go's whitespace trimming ({{- and -}})."""
    out, pos = [], 0
    for m in TOKEN.finditer(text):
        before = text[pos:m.start()]
        if m.group(1) == "-":
            before = before.rstrip()
        out.append(("text", before))
        out.append(("action", m.group(2), m.group(3) == "-"))
        pos = m.end()
    out.append(("text", text[pos:]))
    # A right trim eats the whitespace that follows.
    for i, t in enumerate(out):
        if t[0] == "action" and t[2] and i + 1 < len(out):
            out[i + 1] = ("text", out[i + 1][1].lstrip())
    return out


def parse(tokens, i=0, stop=("end",)):
    """A tree: ("text", s) | ("expr", e) | ("if", [(cond, body)], else) | ("range", vars, e, body)."""
    nodes = []
    while i < len(tokens):
        t = tokens[i]
        if t[0] == "text":
            nodes.append(("text", t[1]))
            i += 1
            continue
        act = t[1]
        word = act.split(None, 1)[0] if act else ""
        if word in stop:
            return nodes, i
        if act.startswith("/*"):
            i += 1
            continue
        if word == "if":
            branches, els = [], None
            cond = act[2:].strip()
            body, i = parse(tokens, i + 1, ("end", "else"))
            branches.append((cond, body))
            while tokens[i][1].startswith("else"):
                rest = tokens[i][1][4:].strip()
                if rest.startswith("if "):
                    body, i = parse(tokens, i + 1, ("end", "else"))
                    branches.append((rest[3:].strip(), body))
                else:
                    els, i = parse(tokens, i + 1, ("end",))
            nodes.append(("if", branches, els))
            i += 1
            continue
        if word == "range":
            m = re.match(r"range\s+(?:(\$\w+)\s*,\s*)?(\$\w+)\s*:=\s*(.+)$", act)
            if not m:
                raise SystemExit(f"unsupported range: {act}")
            body, i = parse(tokens, i + 1, ("end",))
            nodes.append(("range", (m.group(1), m.group(2)), m.group(3), body))
            i += 1
            continue
        if word in ("with", "define", "template", "block", "include"):
            raise SystemExit(f"unsupported action: {act}")
        nodes.append(("expr", act))
        i += 1
    return nodes, i


def split_args(s):
    """Words of a command, keeping quoted strings and (…) groups whole."""
    out, depth, cur, q = [], 0, "", False
    for ch in s:
        if q:
            cur += ch
            if ch == '"':
                q = False
            continue
        if ch == '"':
            q = True
            cur += ch
        elif ch == "(":
            depth += 1
            cur += ch
        elif ch == ")":
            depth -= 1
            cur += ch
        elif ch.isspace() and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def split_pipe(s):
    parts, depth, cur, q = [], 0, "", False
    for ch in s:
        if ch == '"':
            q = not q
        if not q and ch == "(":
            depth += 1
        if not q and ch == ")":
            depth -= 1
        if ch == "|" and depth == 0 and not q:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


class Ctx:
    def __init__(self, root, chart_dir, vars=None):
        self.root, self.chart_dir, self.vars = root, chart_dir, vars or {}


def lookup(path, ctx):
    if path.startswith("$"):
        name, _, rest = path.partition(".")
        if name not in ctx.vars:
            raise SystemExit(f"unknown variable {name}")
        v = ctx.vars[name]
    else:
        v, rest = ctx.root, path[1:]
    for key in filter(None, rest.split(".")):
        if not isinstance(v, dict):
            raise SystemExit(f"{path}: {key} of a non-map")
        v = v.get(key)
    return v


def to_yaml(v):
    if v is None:
        return "null"
    if v in ({}, []):
        return "{}" if v == {} else "[]"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


def go_str(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return "map[...]" if isinstance(v, dict) else "[...]"
    return str(v)


def truthy(v):
    return bool(v) and v != 0


def call(fn, args, ctx):
    if fn == "quote":
        return json.dumps(go_str(args[0]))
    if fn == "default":
        return args[1] if truthy(args[1]) else args[0]
    if fn == "printf":
        return args[0].replace("%s", "{}").format(*[go_str(a) for a in args[1:]])
    if fn == "toYaml":
        return to_yaml(args[0])
    if fn in ("nindent", "indent"):
        pad = " " * int(args[0])
        # Sprig pads every line, empty ones too.
        body = "\n".join(pad + line for line in go_str(args[1]).split("\n"))
        return ("\n" + body) if fn == "nindent" else body
    if fn == "and":
        r = True
        for a in args:
            r = a
            if not truthy(a):
                return a
        return r
    if fn == "or":
        for a in args:
            if truthy(a):
                return a
        return args[-1]
    if fn == "not":
        return not truthy(args[0])
    if fn == ".Files.Get":
        path = os.path.join(ctx.chart_dir, args[0])
        with open(path) as f:
            return f.read()
    raise SystemExit(f"unsupported function: {fn}")


def term(t, ctx):
    if t.startswith("(") and t.endswith(")"):
        return evaluate(t[1:-1], ctx)
    if t.startswith('"'):
        return json.loads(t)
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    if t in ("true", "false"):
        return t == "true"
    if t.startswith(".") or t.startswith("$"):
        return lookup(t, ctx)
    raise SystemExit(f"unsupported term: {t}")


def command(cmd, ctx, piped=None):
    words = split_args(cmd)
    head = words[0]
    if head.startswith(("(", '"', "$")) or (head.startswith(".") and head != ".Files.Get") or re.fullmatch(r"-?\d+|true|false", head):
        if len(words) != 1:
            raise SystemExit(f"unsupported command: {cmd}")
        return term(head, ctx)
    args = [term(w, ctx) for w in words[1:]]
    if piped is not None:
        args.append(piped[0])
    return call(head, args, ctx)


def evaluate(expr, ctx):
    value = None
    for i, part in enumerate(split_pipe(expr)):
        value = command(part, ctx, None if i == 0 else (value,))
    return value


def render(nodes, ctx):
    out = []
    for n in nodes:
        if n[0] == "text":
            out.append(n[1])
        elif n[0] == "expr":
            out.append(go_str(evaluate(n[1], ctx)))
        elif n[0] == "if":
            for cond, body in n[1]:
                if truthy(evaluate(cond, ctx)):
                    out.append(render(body, ctx))
                    break
            else:
                if n[2] is not None:
                    out.append(render(n[2], ctx))
        elif n[0] == "range":
            (kvar, vvar), expr, body = n[1], n[2], n[3]
            coll = evaluate(expr, ctx) or {}
            items = sorted(coll.items()) if isinstance(coll, dict) else list(enumerate(coll))
            for k, v in items:
                vars = dict(ctx.vars)
                if kvar:
                    vars[kvar] = k
                vars[vvar] = v
                out.append(render(body, Ctx(ctx.root, ctx.chart_dir, vars)))
    return "".join(out)


def merge(a, b):
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            merge(a[k], v)
        else:
            a[k] = v
    return a


def main():
    args = sys.argv[1:]
    extra = []
    while "-f" in args:
        i = args.index("-f")
        extra.append(args[i + 1])
        del args[i:i + 2]
    chart_dir = args[0]
    release = args[1] if len(args) > 1 else "gpuslice"
    with open(os.path.join(chart_dir, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    with open(os.path.join(chart_dir, "values.yaml")) as f:
        values = yaml.safe_load(f) or {}
    for path in extra:
        with open(path) as f:
            merge(values, yaml.safe_load(f) or {})
    root = {
        "Values": values,
        "Release": {"Name": release, "Namespace": "default"},
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart.get("appVersion", "")},
    }
    tdir = os.path.join(chart_dir, "templates")
    for name in sorted(os.listdir(tdir)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(tdir, name)) as f:
            tree, _ = parse(lex(f.read()))
        text = render(tree, Ctx(root, chart_dir)).strip()
        if text:
            print(f"---\n# Source: {chart['name']}/templates/{name}\n{text}")


if __name__ == "__main__":
    main()
