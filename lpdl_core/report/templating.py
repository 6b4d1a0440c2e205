"""The report's Jinja2 environments and the text helpers its templates share.

Two environments load `lpdl_core/report/templates/` (jinja2.PackageLoader, so an installed package
finds them too):

  html_env()  autoescaped HTML: every {{ value }} is escaped unless it is markupsafe.Markup.
  tex_env()   LaTeX with delimiters that do not clash with TeX's braces and percent signs:
              ((* block *)), ((( value ))), ((= comment =)). It escapes like HTML does: every
              ((( value ))) goes through tex_escape unless it is `Tex` (LaTeX source already made
              safe, e.g. a rendered tabular or a macro's output passed on with |raw).

Both have the filters num (2 decimals), signed (+1.25 / -0.77; in LaTeX $+$1.25 / $-$0.77) and
epochs ('[3, 5]' -> 'epochs 3, 5'), and the globals heading(), caption() and anchor().
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import jinja2
from markupsafe import Markup

_ESCAPES = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
    "±": r"$\pm$", "—": "---", "–": "--", "≈": r"$\approx$", "≥": r"$\geq$", "≤": r"$\leq$",
    "→": r"$\rightarrow$", "×": r"$\times$", "·": r"$\cdot$", "…": r"\ldots{}",
    "−": "-", "Δ": r"$\Delta$", "δ": r"$\delta$", "α": r"$\alpha$", "β": r"$\beta$",
    "γ": r"$\gamma$", "η": r"$\eta$", "λ": r"$\lambda$", "μ": r"$\mu$", "σ": r"$\sigma$",
    "†": r"$^\dagger$", "\u00a0": "~", "“": "``", "”": "''", "‘": "`", "’": "'", "°": r"$^\circ$",
}


class Tex(str):
    """LaTeX source that is safe as it is: tex_env prints it without escaping."""


def tex_escape(text) -> str:
    """Escape LaTeX specials; map common Unicode to commands, drop what pdflatex can't set."""
    out = []
    for ch in str(text):
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 128:
            out.append(ch if ch.isprintable() else " ")  # newlines too: no \par in captions
        else:
            ascii_ = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            out.append(tex_escape(ascii_) if ascii_ else "?")
    return "".join(out)


def tex(text) -> Tex:
    """tex_escape as a marked-safe value (idempotent: Tex passes through)."""
    return text if isinstance(text, Tex) else Tex(tex_escape(text))


def _finalize_tex(value) -> Tex:
    return tex("" if value is None else value)


def num(x) -> str:
    return f"{x:.2f}"


def signed(x) -> str:
    return f"{x:+.2f}"


def signed_tex(x) -> Tex:
    return Tex(f"$+${x:.2f}" if x >= 0 else f"$-${-x:.2f}")


def epochs(diverged_at: str) -> str:
    """'[3]' -> 'epoch 3'; '[3, 5]' -> 'epochs 3, 5'; '' -> ''."""
    inner = (diverged_at or "").strip().strip("[]()").strip()
    if not inner:
        return ""
    parts = [p.strip() for p in inner.split(",") if p.strip()]
    return ("epochs " if len(parts) > 1 else "epoch ") + ", ".join(parts)


def heading(name: str, title: str = "") -> str:
    """What a reader sees for a table or figure: its title, else a readable form of its id
    ("table2" -> "Table 2", "fig1" -> "Figure 1 runs"); never the bare id."""
    title = (title or "").strip()
    if title and title != name:
        return title
    m = re.fullmatch(r"(table|fig|figure)[-_ ]?(\d+)[-_ ]?(.*)", name, flags=re.I)
    if m:
        kind = "Table" if m.group(1).lower() == "table" else "Figure"
        rest = re.sub(r"[-_]+", " ", m.group(3)).strip()
        rest = rest or ("runs" if kind == "Figure" else "")  # Figure 1's runs: the fig1 table
        return f"{kind} {m.group(2)}" + (f" {rest}" if rest else "")
    words = re.sub(r"[-_]+", " ", name).strip()
    return words[:1].upper() + words[1:] if words else "Untitled"


def caption(text: str, title: str) -> str:
    """A caption without a leading copy of its heading ("Table 2. Decentralized ..." under the
    heading "Table 2" reads "Decentralized ...")."""
    text = (text or "").strip()
    rest = re.sub(r"^%s\s*[.:]\s*" % re.escape(title), "", text, flags=re.I) if title else text
    return rest or text


def anchor(prefix: str, name: str) -> str:
    """A stable HTML id derived from an id: ('table', 'table2') -> 'table-table2'."""
    return prefix + "-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name)


def css_class(text: str) -> str:
    """A value as a CSS class name: 'same sign' -> 'same-sign'."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-")


def _common(env: jinja2.Environment) -> jinja2.Environment:
    env.filters.update(num=num, epochs=epochs)
    env.globals.update(heading=heading, anchor=anchor, caption=caption)
    return env


@lru_cache(maxsize=None)
def html_env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("lpdl_core.report", "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(signed=signed, css_class=css_class)
    return _common(env)


@lru_cache(maxsize=None)
def tex_env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("lpdl_core.report", "templates"),
                             block_start_string="((*", block_end_string="*))",
                             variable_start_string="(((", variable_end_string=")))",
                             comment_start_string="((=", comment_end_string="=))",
                             autoescape=False, finalize=_finalize_tex, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(tex_escape=tex, raw=Tex, signed=signed_tex)
    return _common(env)


def html_macro(template: str, name: str):
    """A macro of an HTML template, callable from Python (returns Markup)."""
    return getattr(html_env().get_template(template).module, name)


def tex_macro(template: str, name: str):
    """A macro of a LaTeX template, callable from Python (returns Tex)."""
    macro = getattr(tex_env().get_template(template).module, name)
    return lambda *args, **kw: Tex(str(macro(*args, **kw)))


__all__ = ["Markup", "Tex", "anchor", "caption", "css_class", "epochs", "heading", "html_env", "html_macro",
           "num", "signed", "tex", "tex_env", "tex_escape", "tex_macro"]
