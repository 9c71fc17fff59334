"""A deterministic, realistic static site for the static scenario.

`make_site(dest, seed)` writes the same bytes for the same seed: an HTML page (~30 KB), six
CSS/JS bundles of 10-300 KB that look like minified framework output (mangled one- and
two-letter identifiers, a vocabulary of property names used with a skewed frequency,
string literals, numbers, hashes, colours), so gzip gets ~3-5x on them as on real bundles
(not the 100x of repeated bytes), two JPEG and two PNG images of random bytes (5-100 KB,
incompressible, served as they are) and an SVG icon sprite.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

# (path under the root, kind, target size in bytes). The page is requested as "/".
FILES = [
    ("index.html", "html", 30_000),
    ("assets/vendor.js", "js", 270_000),
    ("assets/app.js", "js", 110_000),
    ("assets/chunk-dashboard.js", "js", 38_000),
    ("assets/polyfills.js", "js", 14_000),
    ("assets/main.css", "css", 95_000),
    ("assets/pages.css", "css", 22_000),
    ("img/hero.jpg", "jpeg", 88_000),
    ("img/team.jpg", "jpeg", 52_000),
    ("img/logo.png", "png", 14_000),
    ("img/avatar.png", "png", 7_000),
    ("img/icons.svg", "svg", 9_000),
]
BUNDLE_KINDS = ("js", "css")
IMAGE_KINDS = ("jpeg", "png")

_PROPS = (
    "props state children createElement useState useEffect useMemo useCallback useRef "
    "prototype length push call apply default exports value current memoizedState return "
    "type key ref defineProperty hasOwnProperty toString forEach map filter concat then "
    "catch resolve reject Symbol iterator assign setState __esModule document window "
    "addEventListener removeEventListener querySelector innerHTML className style display "
    "flags lanes pendingProps stateNode sibling alternate tag elementType updateQueue "
    "payload callback next dependencies mode index child memoizedProps nodeType parentNode "
    "firstChild nextSibling ownerDocument textContent setAttribute removeAttribute "
    "getAttribute target currentTarget preventDefault stopPropagation timeStamp isArray "
    "keys create freeze slice splice indexOf join split replace test exec match "
    "toLowerCase charCodeAt fromCharCode get set has delete clear size add dispatch "
    "subscribe getState context Provider Consumer displayName render hydrate unmount "
    "onClick onChange onSubmit href pathname search hash location history navigate "
    "params query data error loading status headers method body json fetch signal"
).split()
_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have "
    "from or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her "
    "would make like him into time has look two more write go see number no way could people "
    "my than first water been call who oil its now find long down day did get come made may "
    "part dashboard account settings profile search results pricing features customers "
    "release notes support documentation deploy server cluster metrics latency request"
).split()
_CSS_CLASSES = (
    "btn btn-primary btn-secondary btn-outline nav navbar navbar-brand nav-link nav-item "
    "container row col col-md-6 col-lg-4 card card-body card-title card-footer header footer "
    "hero hero-title hero-subtitle badge alert alert-info alert-warning modal modal-dialog "
    "modal-header dropdown dropdown-menu dropdown-item form-control form-group input-group "
    "table table-striped list-group list-group-item sidebar content main grid flex "
    "d-flex justify-content-between align-items-center text-center text-muted mt-2 mb-3 "
    "px-4 py-2 shadow rounded icon avatar tooltip popover pagination page-link breadcrumb "
    "progress progress-bar spinner toast tabs tab-pane is-active is-open is-disabled"
).split()
_CSS_PROPS = (
    "display position top left right bottom margin margin-top margin-bottom padding "
    "padding-left padding-right width max-width height min-height color background "
    "background-color border border-radius border-color font-size font-weight line-height "
    "text-align text-decoration box-shadow transition transform opacity z-index overflow "
    "cursor flex flex-direction align-items justify-content gap outline white-space"
).split()
_CSS_VALUES = (
    "0 auto 1rem .5rem .25rem 1.5rem 2rem 100% 50% none block inline-block flex grid "
    "relative absolute fixed hidden pointer center space-between column nowrap inherit "
    "transparent 1px 2px 4px 8px 12px 16px 600 700 400 1.5 1.25 0.875rem "
    "all .15s ease-in-out translateY(-1px) solid currentColor"
).split()


def _picker(rng: random.Random, items: list[str], s: float = 1.1):
    """pick() -> one of items with Zipf-like weights (exponent s) over a seeded shuffle: a
    few very common, a long tail, as identifiers in real code."""
    xs = list(items)
    rng.shuffle(xs)
    weights = [1.0 / (i + 1) ** s for i in range(len(xs))]
    cum = []
    acc = 0.0
    for w in weights:
        acc += w
        cum.append(acc)

    def pick() -> str:
        return rng.choices(xs, cum_weights=cum, k=1)[0]
    return pick


def _mangled() -> list[str]:
    one = list("etnroiaulcsfdphmgvybxkwETNROIASMCL_$")
    two = [a + b for a in "etnroiaul" for b in "eAtTnNrRoOiI"]
    return one + two


def _hexid(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def gen_js(rng: random.Random, size: int) -> bytes:
    ident = _picker(rng, _mangled(), 1.3)
    prop = _picker(rng, _PROPS, 1.1)
    word = _picker(rng, _WORDS, 0.8)
    idioms = ('Object.defineProperty(t,"__esModule",{value:!0});',
              "function(e){return e&&e.__esModule?e:{default:e}}", "void 0", "!0", "!1",
              "null", 'typeof e=="function"', "n.d(t,{default:function(){return r}})",
              "(0,r.jsx)", "(0,r.jsxs)", "arguments.length>1&&void 0!==arguments[1]?arguments[1]:{}")

    def num() -> str:
        r = rng.random()
        if r < 0.5:
            return str(rng.randint(0, 9))
        if r < 0.9:
            return str(rng.randint(10, 999))
        return "0x" + _hexid(rng, rng.choice((2, 4)))

    def string() -> str:
        r = rng.random()
        if r < 0.45:
            return '"' + prop() + '"'
        if r < 0.75:
            return '"' + " ".join(word() for _ in range(rng.randint(1, 6))) + '"'
        if r < 0.85:
            return '"' + _hexid(rng, 8) + '"'
        return f'"/api/{word()}/{prop()}"'

    def expr(depth: int = 0) -> str:
        r = rng.random()
        if depth > 2 or r < 0.25:
            return rng.choice((ident, ident, ident, num, string))()
        if r < 0.33:
            return rng.choice(idioms)
        if r < 0.45:
            return f"{ident()}.{prop()}"
        if r < 0.6:
            args = ",".join(expr(depth + 1) for _ in range(rng.randint(0, 3)))
            return f"{ident()}.{prop()}({args})"
        if r < 0.7:
            return f"{expr(depth + 1)}{rng.choice(('===', '!==', '&&', '||', '+', '<', '>'))}" \
                   f"{expr(depth + 1)}"
        if r < 0.78:
            return f"{expr(depth + 1)}?{expr(depth + 1)}:{expr(depth + 1)}"
        if r < 0.86:
            return "{" + ",".join(f"{prop()}:{expr(depth + 1)}"
                                  for _ in range(rng.randint(1, 4))) + "}"
        if r < 0.92:
            return "[" + ",".join(expr(depth + 1) for _ in range(rng.randint(1, 4))) + "]"
        return f"function({','.join(ident() for _ in range(rng.randint(0, 3)))}){{return {expr(depth + 1)}}}"

    def stmt(depth: int = 0) -> str:
        r = rng.random()
        if depth < 2 and r < 0.12:
            args = ",".join(ident() for _ in range(rng.randint(0, 4)))
            body = "".join(stmt(depth + 1) for _ in range(rng.randint(2, 6)))
            return f"function {ident()}({args}){{{body}}}"
        if depth < 2 and r < 0.2:
            body = "".join(stmt(depth + 1) for _ in range(rng.randint(1, 3)))
            return f"if({expr()}){{{body}}}"
        if r < 0.26:
            i, a = ident(), ident()
            return f"for(var {i}=0;{i}<{a}.length;{i}++){ident()}.push({a}[{i}]);"
        if r < 0.45:
            return f"var {ident()}={expr()}" + "".join(
                f",{ident()}={expr()}" for _ in range(rng.randint(0, 2))) + ";"
        if r < 0.6:
            return f"{ident()}.{prop()}={expr()};"
        if r < 0.72:
            return f"return {expr()};"
        if r < 0.78:
            return f"{ident()}.prototype.{prop()}=function({ident()}){{return this.{prop()}}};"
        if r < 0.82:
            return f"throw Error({ident()}({rng.randint(1, 450)}));"
        return f"{expr()};"

    out = ['"use strict";(self.webpackChunkapp=self.webpackChunkapp||[]).push([[' +
           str(rng.randint(100, 999)) + "],{"]
    n = sum(len(x) for x in out)
    while n < size - 40:
        mod = f"{rng.randint(1000, 99999)}:function(e,t,n){{" + "".join(
            stmt() for _ in range(rng.randint(3, 12))) + "},"
        out.append(mod)
        n += len(mod)
    text = "".join(out)[: max(0, size - 8)].rstrip(",")
    return (text + "}]);\n").encode()


def gen_css(rng: random.Random, size: int) -> bytes:
    cls = _picker(rng, _CSS_CLASSES, 0.8)
    prop = _picker(rng, _CSS_PROPS, 0.9)
    val = _picker(rng, _CSS_VALUES, 0.9)

    def value() -> str:
        r = rng.random()
        if r < 0.2:
            return "#" + _hexid(rng, rng.choice((3, 6)))
        if r < 0.3:
            return f"rgba({rng.randint(0, 255)},{rng.randint(0, 255)},{rng.randint(0, 255)}," \
                   f".{rng.randint(1, 9)})"
        if r < 0.4:
            return f"var(--{cls()}-{prop()})"
        return " ".join(val() for _ in range(rng.randint(1, 3)))

    def rule() -> str:
        sel = ",".join(
            " ".join("." + cls() + (rng.choice(("", "", ":hover", ":focus", "::before",
                                                 ">*", ":not(:last-child)")))
                     for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 2)))
        decls = ";".join(f"{prop()}:{value()}" for _ in range(rng.randint(1, 6)))
        return f"{sel}{{{decls}}}"

    out = [":root{" + ";".join(f"--{c}-{p}:#{_hexid(rng, 6)}" for c in _CSS_CLASSES[:20]
                                for p in ("color", "background")) + "}"]
    n = len(out[0])
    while n < size - 30:
        if rng.random() < 0.05:
            block = "@media (min-width:" + str(rng.choice((576, 768, 992, 1200))) + "px){" + \
                "".join(rule() for _ in range(rng.randint(2, 8))) + "}"
        else:
            block = rule()
        out.append(block)
        n += len(block)
    return "".join(out)[:size].encode()


def gen_html(rng: random.Random, size: int, links: list[tuple[str, str]]) -> bytes:
    word = _picker(rng, _WORDS, 0.8)
    cls = _picker(rng, _CSS_CLASSES, 0.8)

    def sentence() -> str:
        w = " ".join(word() for _ in range(rng.randint(6, 18)))
        return w[0].upper() + w[1:] + rng.choice((".", ".", ".", "?", "!"))

    head = ["<!doctype html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>Veloxy bench site - " + " ".join(word() for _ in range(4)) + "</title>"]
    body = ["<body>", f'<nav class="navbar {cls()}"><ul class="nav">' + "".join(
        f'<li class="nav-item"><a class="nav-link" href="/{word()}/">{word().title()}</a></li>'
        for _ in range(8)) + "</ul></nav>"]
    for kind, href in links:
        if kind == "css":
            head.append(f'<link rel="stylesheet" href="/{href}">')
        elif kind == "js":
            head.append(f'<script defer src="/{href}"></script>')
        elif kind == "svg":
            body.append(f'<svg class="icon" aria-hidden="true"><use href="/{href}#icon-0"></use></svg>')
        elif kind in IMAGE_KINDS:
            body.append(f'<img class="{cls()}" src="/{href}" alt="{word()} {word()}" '
                        f'width="{rng.randint(64, 1200)}" height="{rng.randint(64, 800)}">')
    head.append("</head>")
    tail = ['<footer class="footer">&copy; veloxy bench</footer>', "</body>", "</html>", ""]
    n = sum(len(x) + 1 for x in head + body + tail)
    while n < size:
        block = (f'<section class="{cls()} {cls()}" id="s-{_hexid(rng, 6)}">'
                 f'<h2 class="{cls()}">{sentence()}</h2>'
                 + "".join(f'<p class="{cls()}">{" ".join(sentence() for _ in range(rng.randint(2, 5)))}</p>'
                           for _ in range(rng.randint(1, 4)))
                 + f'<a class="btn {cls()}" href="/{word()}/{_hexid(rng, 8)}">{word().title()}</a>'
                 + "</section>")
        body.append(block)
        n += len(block) + 1
    return "\n".join(head + body + tail).encode()


def gen_svg(rng: random.Random, size: int) -> bytes:
    out = ['<svg xmlns="http://www.w3.org/2000/svg" style="display:none">']
    n = len(out[0])
    i = 0
    while n < size - 10:
        pts = " ".join(f"{rng.choice('MLLLLCQ')}{rng.randint(0, 24)}.{rng.randint(0, 99)} "
                       f"{rng.randint(0, 24)}.{rng.randint(0, 99)}" for _ in range(rng.randint(4, 12)))
        sym = (f'<symbol id="icon-{i}" viewBox="0 0 24 24"><path fill="none" '
               f'stroke="currentColor" stroke-width="2" d="{pts}z"/></symbol>')
        out.append(sym)
        n += len(sym)
        i += 1
    out.append("</svg>\n")
    return "".join(out).encode()


def gen_jpeg(rng: random.Random, size: int) -> bytes:
    head = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    return head + rng.randbytes(size - len(head) - 2) + b"\xff\xd9"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + \
        struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def gen_png(rng: random.Random, size: int) -> bytes:
    ihdr = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 6, 0, 0, 0))
    fixed = 8 + len(ihdr) + 12 + 12
    idat = _png_chunk(b"IDAT", rng.randbytes(size - fixed))
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat + _png_chunk(b"IEND", b"")


GENERATORS = {"js": gen_js, "css": gen_css, "svg": gen_svg, "jpeg": gen_jpeg, "png": gen_png}


def site_files(seed: int = 6) -> dict[str, bytes]:
    """path -> content, in FILES order; each file from its own seeded generator."""
    out = {}
    links = [(kind, path) for path, kind, _ in FILES if kind != "html"]
    for path, kind, size in FILES:
        rng = random.Random(f"{seed}:{path}")
        if kind == "html":
            out[path] = gen_html(rng, size, links)
        else:
            out[path] = GENERATORS[kind](rng, size)
    return out


def make_site(dest: Path, seed: int = 6) -> dict[str, bytes]:
    """Write the site under dest; returns path -> content."""
    files = site_files(seed)
    for path, data in files.items():
        f = dest / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    return files


def url_path(path: str) -> str:
    """The URL path a browser requests for a site file (the page as "/")."""
    return "/" if path == "index.html" else "/" + path
