"""Parse HCL with python-hcl2 and build rlsched's syntax tree, with positions.

python-hcl2 8.1.4 is used only as a parser (``hcl2.parses_to_tree``); its
transformer's dictionaries lose positions and accept inputs that Go HCL rejects
(``shared/docs/HCL.md`` section 4). This module walks the raw Lark tree instead
and:

* rejects what python-hcl2 wrongly accepts: duplicate attributes, template
  sequences in block labels, two definitions on one line, an attribute and a
  block with one name, multi-line quoted strings;
* translates Lark's grammar-token errors into plain phrases (section 7);
* returns :mod:`rlsched.spec.ast` nodes that carry file:line:column ranges.

The Lark rule names used here are those of python-hcl2's ``hcl2.lark`` (8.x).
"""

from __future__ import annotations

import re
from typing import Any

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from rlsched.spec import ast as A
from rlsched.spec.diagnostics import EvalError, error
from rlsched.spec.lexer import unclosed_bracket
from rlsched.spec.limits import offset_range, source_problem
from rlsched.spec.model import Diagnostic, SourceRange

_ESCAPES = re.compile(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def parse_text(text: str, filename: str) -> tuple[A.Body | None, list[Diagnostic]]:
    """Parse one file's text into a :class:`~rlsched.spec.ast.Body` and its diagnostics.

    Returns ``(None, diags)`` when the syntax is invalid, otherwise the body
    (possibly with structural diagnostics such as a duplicate attribute; the
    first definition is kept so that evaluation can still find further errors).
    """
    import hcl2  # deferred: the Lark grammar loads in ~50 ms

    problem = source_problem(text)
    if problem is not None:
        summary, detail, offset = problem
        return None, [error(summary, detail, offset_range(text, offset, filename))]
    try:
        tree = hcl2.parses_to_tree(text)
    except UnexpectedInput as exc:
        return None, [translate_syntax_error(exc, text, filename)]
    except (LarkError, RecursionError, ValueError) as exc:  # pragma: no cover - defensive
        return None, [error("Invalid syntax", f"The file could not be parsed ({type(exc).__name__}).",
                            SourceRange(filename, 1, 1))]
    conv = _Converter(filename)
    try:
        body = conv.body(tree.children[0])
    except EvalError as exc:
        return None, [*conv.diags, exc.diagnostic()]
    except RecursionError:
        return None, [error("Expression too deeply nested", "", SourceRange(filename, 1, 1))]
    return body, conv.diags


# --- syntax errors -------------------------------------------------------------------

_PLAIN = {
    "RBRACE": '"}"', "LBRACE": '"{"', "RSQB": '"]"', "LSQB": '"["', "RPAR": '")"', "LPAR": '"("',
    "COMMA": '","', "EQ": '"="', "COLON": '":"', "DBLQUOTE": "a quoted string", "NAME": "a name",
    "INT_LITERAL": "a number", "FLOAT_LITERAL": "a number", "NL_OR_COMMENT": "a new line", "QMARK": '"?"',
    "DOT": '"."', "FOR_OBJECT_ARROW": '"=>"', "ELLIPSIS": '"..."', "$END": "the end of the file",
    "IN": '"in"', "IF": '"if"', "FOR": '"for"', "HEREDOC_TEMPLATE": "a heredoc",
}
_EXPR_START = {"NAME", "INT_LITERAL", "DBLQUOTE", "LSQB", "LBRACE", "LPAR"}


def _describe(tok: Token | None) -> str:
    if tok is None:
        return "this"
    if tok.type == "$END":
        return "the end of the file"
    if tok.type == "NL_OR_COMMENT":
        return "a comment" if str(tok).lstrip().startswith(("#", "//", "/*")) else "the end of the line"
    value = str(tok).strip()
    if tok.type == "STRING_CHARS":  # the contextual lexer's fallback: the real culprit is the first char
        value = value[:1]
    if len(value) > 20:
        value = value[:20] + "…"
    return f'"{value}"' if value else _PLAIN.get(tok.type, tok.type)


def translate_syntax_error(exc: UnexpectedInput, text: str, filename: str) -> Diagnostic:
    """Turn a Lark error into an "Invalid syntax" diagnostic in plain words."""
    line = getattr(exc, "line", None) or 1
    column = getattr(exc, "column", None) or 1
    if line < 1:
        line, column = 1, 1
    rng = SourceRange(filename, line, column)
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream if isinstance(exc.pos_in_stream, int) else -1
        ch = text[pos] if 0 <= pos < len(text) else "?"
        return error("Invalid character", f'The character "{ch}" is not valid here.', rng)
    tok: Token | None = getattr(exc, "token", None)
    expected: set[str] = set(getattr(exc, "expected", None) or ())
    if isinstance(exc, UnexpectedEOF) or (tok is not None and tok.type == "$END"):
        if "RBRACE" in expected or "RSQB" in expected or "RPAR" in expected:
            opener = unclosed_bracket(text)
            if opener is not None:
                closer = {"{": "}", "[": "]", "(": ")"}[opener.text]
                return error("Unclosed bracket",
                             f'This "{opener.text}" is never closed: add "{closer}" before the end of the file.',
                             SourceRange(filename, opener.line, opener.column))
            return error("Invalid syntax", 'The file ends before a "}", "]" or ")" that closes an earlier bracket.',
                         rng)
        if "DBLQUOTE" in expected or "STRING_CHARS" in expected:
            return error("Unterminated string", 'A quoted string must end with " on the same line.', rng)
        return error("Invalid syntax", "The file ends in the middle of a definition.", rng)
    found = _describe(tok)
    if tok is not None and tok.type == "STRING_CHARS" and str(tok).lstrip().startswith('"') is False \
            and not expected & {"STRING_CHARS"} and str(tok)[:1] not in "=":
        ch = str(tok)[:1]
        if not (ch.isalnum() or ch in "_\"'{}[]()"):
            return error("Invalid character", f'The character "{ch}" is not valid here.', rng)
    if {"COMMA", "RSQB"} <= expected and len(expected) <= 4:
        detail = 'Expected "," or "]" between list elements.'
    elif {"COMMA", "RPAR"} <= expected and "RSQB" not in expected:
        detail = 'Expected "," or ")" between function arguments.'
    elif "RBRACE" in expected and ("COMMA" in expected or "EQ" in expected or "COLON" in expected) \
            and "NAME" not in expected:
        detail = 'Expected "=" after an object key, or "," or "}" after an object element.'
    elif "EQ" in expected and "LBRACE" in expected:
        detail = f'Found {found}: expected "=" to set an argument, or a label or "{{" to open a block.'
    elif len(_EXPR_START & expected) >= 4 and "EQ" not in expected:
        detail = f"Found {found} where a value was expected (a number, a quoted string, a list, an object, " \
                 "a reference or a function call)."
    elif expected == {"LBRACE"}:
        detail = f'Found {found}: expected "=" to set an argument, or "{{" to open a block.'
    elif "NAME" in expected and not expected & (_EXPR_START - {"NAME"}) and "EQ" not in expected:
        detail = f"Found {found} where an argument name or a block type was expected."
    elif "NL_OR_COMMENT" in expected:
        detail = f"Found {found} after a complete value: an argument ends at the end of its line " \
                 "(start the next one on a new line, or join values with an operator)."
    else:
        plain = sorted({_PLAIN[e] for e in expected if e in _PLAIN})[:6]
        detail = f"Found {found}" + (f"; expected {', '.join(plain)}." if plain else ".")
    return error("Invalid syntax", detail, rng)


# --- tree conversion -----------------------------------------------------------------


def _unescape(raw: str) -> str:
    def sub(m: re.Match[str]) -> str:
        s = m.group(1)
        if s in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[s]
        if s[0] in "uU" and len(s) > 1:
            try:
                return chr(int(s[1:], 16))
            except (ValueError, OverflowError):
                return m.group(0)
        return m.group(0)

    return _ESCAPES.sub(sub, raw)


def _sig(children: list[Any]) -> list[Any]:
    """Children without newline/comment trees (they carry no meaning)."""
    return [c for c in children if not (isinstance(c, Tree) and c.data == "new_line_or_comment")
            and not (isinstance(c, Token) and c.type == "NL_OR_COMMENT")]


def _last_line(node: Tree | Token) -> int:
    """Line where the last meaningful token of ``node`` ends (trailing newlines ignored)."""
    if isinstance(node, Token):
        return node.end_line or node.line or 0
    last = 0
    stack: list[Tree | Token] = [node]  # iterative: an operator chain can nest thousands deep
    while stack:
        item = stack.pop()
        if isinstance(item, Tree):
            stack.extend(item.children)
            continue
        if not isinstance(item, Token) or item.type == "NL_OR_COMMENT":
            continue
        stripped = str(item).rstrip()
        last = max(last, (item.line or 0) + stripped.count("\n"))
    return last


def _first_line(node: Tree | Token) -> int:
    if isinstance(node, Token):
        return node.line or 0
    return node.meta.line if not node.meta.empty else 0


class _Converter:
    """Builds AST nodes; collects structural diagnostics in ``diags``."""

    def __init__(self, filename: str, line_offset: int = 0, col_offset: int = 0) -> None:
        self.filename = filename
        self.line_offset = line_offset
        self.col_offset = col_offset
        self.diags: list[Diagnostic] = []

    def rng(self, node: Tree | Token) -> SourceRange:
        if isinstance(node, Token):
            line, col, el, ec = node.line or 1, node.column or 1, node.end_line, node.end_column
        elif node.meta.empty:
            return SourceRange(self.filename, 1 + self.line_offset, 1)
        else:
            line, col, el, ec = node.meta.line, node.meta.column, node.meta.end_line, node.meta.end_column
        if line == 1:
            col += self.col_offset
            if el == 1 and ec is not None:
                ec += self.col_offset
        return SourceRange(self.filename, line + self.line_offset, col,
                           None if el is None else el + self.line_offset, ec)

    # -- bodies -------------------------------------------------------------------
    def body(self, tree: Tree, open_brace: Token | None = None, close_brace: Token | None = None) -> A.Body:
        out = A.Body()
        items = [c for c in tree.children if isinstance(c, Tree) and c.data in ("attribute", "block")]
        flagged = False  # a one-line block already reported: no "missing newline" on top of it
        if open_brace is not None and items and _first_line(items[0]) == open_brace.line:
            if items[0].data == "block":
                flagged = True
                self.diags.append(error(
                    "Argument definition required",
                    "A single-line block may hold only a single argument; to declare a nested block, put it "
                    "on a line of its own inside its parent block.", self.rng(items[0])))
            elif not (len(items) == 1 and close_brace is not None and _last_line(items[0]) == close_brace.line):
                flagged = True
                self.diags.append(error(
                    "Invalid single-argument block definition",
                    "A block written on one line may hold only a single argument, with the closing brace "
                    "right after it; put each argument on its own line.", self.rng(items[0])))
        for prev, item in zip([None, *items], items, strict=False):
            if prev is not None and not flagged and _first_line(item) == _last_line(prev) and _first_line(item) > 0:
                self.diags.append(error(
                    "Missing newline after argument",
                    "Each argument or block must start on a new line; python-hcl2 would silently accept this, "
                    "Terraform does not.", self.rng(item)))
        block_names: dict[str, A.Block] = {}
        for item in items:
            if item.data == "attribute":
                try:
                    attr = self.attribute(item)
                except RecursionError:  # a chain of thousands of operators or attribute steps
                    self.diags.append(error("Expression too deeply nested",
                                            "The expression chains too many operators, calls or attribute steps "
                                            "to evaluate; split it into local values.", self.rng(item)))
                    continue
                if attr.name in out.attributes:
                    first = out.attributes[attr.name]
                    self.diags.append(error(
                        "Attribute redefined",
                        f'The argument "{attr.name}" was already set at {first.name_rng}; '
                        "each argument may be set only once.", attr.name_rng))
                elif attr.name in block_names:
                    self._name_clash(attr.name, block_names[attr.name].type_rng, attr.name_rng)
                else:
                    out.attributes[attr.name] = attr
            else:
                blk = self.block(item)
                if blk.type in out.attributes:
                    self._name_clash(blk.type, out.attributes[blk.type].name_rng, blk.type_rng)
                    continue
                block_names.setdefault(blk.type, blk)
                out.blocks.append(blk)
        return out

    def _name_clash(self, name: str, first: SourceRange, here: SourceRange) -> None:
        self.diags.append(error(
            "Argument and block with one name",
            f'"{name}" is used both as an argument and as a block type (first at {first}); '
            "use one form only.", here))

    def _name(self, node: Tree) -> str:
        tok = node.children[0]
        return str(tok)

    def attribute(self, tree: Tree) -> A.Attribute:
        name_node, _eq, expr = _sig(tree.children)
        return A.Attribute(self._name(name_node), self.expr(expr), self.rng(tree), self.rng(name_node))

    def block(self, tree: Tree) -> A.Block:
        ch = _sig(tree.children)
        lbrace_i = next(i for i, c in enumerate(ch) if isinstance(c, Token) and c.type == "LBRACE")
        type_node, label_nodes = ch[0], ch[1:lbrace_i]
        lbrace, body_tree, rbrace = ch[lbrace_i], ch[lbrace_i + 1], ch[lbrace_i + 2]
        labels: list[str] = []
        label_rngs: list[SourceRange] = []
        for ln in label_nodes:
            label_rngs.append(self.rng(ln))
            if ln.data == "string":
                parts = self.template_parts(ln)
                if any(not isinstance(p, str) for p in parts):
                    self.diags.append(error(
                        "Invalid block label",
                        "Template sequences are not allowed in block labels: a label must be a literal name "
                        'such as "train", because it is the stable address of the object.', self.rng(ln)))
                    labels.append("".join(p for p in parts if isinstance(p, str)))
                else:
                    labels.append("".join(p for p in parts if isinstance(p, str)))
            else:
                labels.append(self._name(ln))
        body = self.body(body_tree, lbrace, rbrace)
        return A.Block(self._name(type_node), labels, body, self.rng(tree), self.rng(type_node), label_rngs)

    # -- expressions ----------------------------------------------------------------
    def expr(self, node: Tree | Token) -> A.Expr:
        if isinstance(node, Token):  # pragma: no cover - the grammar wraps every token
            raise EvalError("Invalid syntax", f"Unexpected {node!s}.", self.rng(node))
        rng = self.rng(node)
        d = node.data
        ch = _sig(node.children)
        if d == "expr_term":
            if len(ch) == 3 and isinstance(ch[0], Token) and ch[0].type == "LPAR":
                inner = self.expr(ch[1])
                return A.Relative(rng, inner, []) if isinstance(inner, A.Traversal) else inner
            return self.expr(ch[0])
        if d == "int_lit":
            digits = str(ch[0])
            # beyond Python's int() digit limit the number is out of range anyway: the evaluator says so
            return A.Literal(rng, int(digits) if len(digits) <= 4000 else float(digits))
        if d == "float_lit":
            value = float(str(ch[0]))
            return A.Literal(rng, int(value) if value.is_integer() and abs(value) < 2**53 else value)
        if d == "literal_value":
            return A.Literal(rng, {"true": True, "false": False, "null": None}[str(ch[0])])
        if d == "string":
            parts = self.template_parts(node)
            if all(isinstance(p, str) for p in parts):
                return A.Literal(rng, "".join(p for p in parts if isinstance(p, str)))
            return A.Template(rng, parts)
        if d == "template_string":
            raw = str(ch[0])
            return A.Literal(rng, _unescape(raw[2:-2]))
        if d in ("heredoc_template", "heredoc_template_trim"):
            return self.heredoc(ch[0], trim=d.endswith("trim"))
        if d == "identifier":
            return A.Traversal(rng, str(ch[0]), [])
        if d == "keyword":
            return A.Traversal(rng, str(ch[0]), [])
        if d == "tuple":
            return A.TupleExpr(rng, [self.expr(c) for c in ch if isinstance(c, Tree)])
        if d == "object":
            self._check_separators(node)
            return A.ObjectExpr(rng, [self.object_item(c) for c in ch if isinstance(c, Tree)])
        if d == "function_call":
            names = [str(c.children[0]) for c in ch if isinstance(c, Tree) and c.data == "identifier"]
            args_tree = next((c for c in ch if isinstance(c, Tree) and c.data == "arguments"), None)
            args: list[A.Expr] = []
            expand = False
            if args_tree is not None:
                for c in _sig(args_tree.children):
                    if isinstance(c, Tree):
                        args.append(self.expr(c))
                    elif c.type == "ELLIPSIS":
                        expand = True
            return A.Call(rng, "::".join(names), args, expand)
        if d in ("get_attr_expr_term", "index_expr_term"):
            base = self.expr(ch[0])
            step = self.step(ch[1])
            if isinstance(base, A.Traversal | A.Relative):
                base.steps.append(step)
                base.rng = rng
                return base
            if isinstance(base, A.Splat):
                base.steps.append(step)  # x[*].a.b keeps applying to each element
                base.rng = rng
                return base
            return A.Relative(rng, base, [step])
        if d in ("attr_splat_expr_term", "full_splat_expr_term"):
            base = self.expr(ch[0])
            steps = [self.step(c) for c in _sig(ch[1].children) if isinstance(c, Tree)]
            return A.Splat(rng, base, steps)
        if d == "binary_op":
            left = self.expr(ch[0])
            term = _sig(ch[1].children)
            op_tok = term[0].children[0] if isinstance(term[0], Tree) else term[0]
            return A.Binary(rng, str(op_tok).strip(), left, self.expr(term[1]))
        if d == "unary_op":
            return A.Unary(rng, str(ch[0]).strip(), self.expr(ch[1]))
        if d == "conditional":
            exprs = [c for c in ch if isinstance(c, Tree)]
            return A.Conditional(rng, self.expr(exprs[0]), self.expr(exprs[1]), self.expr(exprs[2]))
        if d in ("for_tuple_expr", "for_object_expr"):
            return self.for_expr(node, rng)
        raise EvalError("Unsupported expression", f"rlsched cannot evaluate a {d} expression.", rng)

    def _check_separators(self, node: Tree) -> None:
        """Object elements need a comma or a newline between them (python-hcl2 needs neither)."""
        prev: Tree | None = None
        separated = True
        for c in node.children:
            if isinstance(c, Tree) and c.data == "object_elem":
                if prev is not None and not separated and _first_line(c) == _last_line(prev):
                    self.diags.append(error("Missing item separator",
                                            'Expected "," or a new line between object elements.', self.rng(c)))
                prev, separated = c, False
            elif (isinstance(c, Token) and c.type == "COMMA") or \
                    (isinstance(c, Tree) and c.data == "new_line_or_comment"):
                separated = True

    def step(self, node: Tree) -> A.Step:
        ch = _sig(node.children)
        rng = self.rng(node)
        if node.data == "get_attr":
            target = ch[1]
            return A.GetAttr(str(target.children[0]) if isinstance(target, Tree) else str(target), rng)
        if node.data == "short_index":
            return A.Index(A.Literal(rng, int(str(ch[1]))), rng)
        if node.data == "braces_index":
            return A.Index(self.expr(ch[1]), rng)
        raise EvalError("Unsupported expression", f"rlsched cannot evaluate a {node.data} step.", rng)

    def object_item(self, node: Tree) -> A.ObjectItem:
        key_node, _sep, value = _sig(node.children)
        key_inner = _sig(key_node.children)[0]
        value_expr = self.expr(value)
        if isinstance(key_inner, Tree) and key_inner.data == "keyword":
            name = str(key_inner.children[0])
            return A.ObjectItem(A.Literal(self.rng(key_inner), name), value_expr, name)
        key = self.expr(key_inner)
        if isinstance(key, A.Traversal) and not key.steps:
            return A.ObjectItem(A.Literal(key.rng, key.root), value_expr, key.root)
        if isinstance(key, A.Relative) and not key.steps:
            key = key.source  # (expr) keys are evaluated
        return A.ObjectItem(key, value_expr)

    def for_expr(self, node: Tree, rng: SourceRange) -> A.ForExpr:
        ch = _sig(node.children)
        intro = next(c for c in ch if isinstance(c, Tree) and c.data == "for_intro")
        intro_ch = _sig(intro.children)
        idents = [str(c.children[0]) for c in intro_ch if isinstance(c, Tree) and c.data == "identifier"]
        coll = next(c for c in intro_ch if isinstance(c, Tree) and c.data != "identifier")
        key_var, value_var = (idents[0], idents[1]) if len(idents) == 2 else (None, idents[0])
        exprs = [c for c in ch if isinstance(c, Tree) and c.data not in ("for_intro", "for_cond")]
        cond_tree = next((c for c in ch if isinstance(c, Tree) and c.data == "for_cond"), None)
        cond = None
        if cond_tree is not None:
            cond = self.expr(next(c for c in _sig(cond_tree.children) if isinstance(c, Tree)))
        group = any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in ch)
        if node.data == "for_object_expr":
            return A.ForExpr(rng, key_var, value_var, self.expr(coll), self.expr(exprs[1]), self.expr(exprs[0]),
                             cond, group)
        return A.ForExpr(rng, key_var, value_var, self.expr(coll), self.expr(exprs[0]), None, cond)

    # -- templates ------------------------------------------------------------------
    def template_parts(self, node: Tree) -> list[A.TemplatePart]:
        """Literal text and expressions of a quoted string, directives nested."""
        flat: list[tuple[str, Any, bool, bool]] = []  # (kind, payload, strip_left, strip_right)
        for part in node.children:
            if isinstance(part, Token):
                continue  # the quotes
            inner = part.children[0]
            if isinstance(inner, Token):
                text = str(inner)
                if inner.type == "STRING_CHARS":
                    if "\n" in text:
                        self.diags.append(error(
                            "Invalid multi-line string",
                            "A quoted string must end on the line where it starts; use a heredoc "
                            "(<<EOT ... EOT) for text over several lines.", self.rng(inner)))
                    flat.append(("lit", _unescape(text), False, False))
                else:  # escaped $${ / %%{
                    flat.append(("lit", text[1:], False, False))
                continue
            ich = _sig(inner.children)
            strips = [isinstance(c, Token) and c.type == "STRIP_MARKER" for c in ich]
            sl = len(strips) > 1 and strips[1]
            sr = len(strips) > 1 and strips[-2]
            exprs = [c for c in ich if isinstance(c, Tree) and c.data != "identifier"]
            if inner.data == "interpolation":
                flat.append(("expr", self.expr(exprs[0]), False, False))
            elif inner.data == "template_if_start":
                flat.append(("if", self.expr(exprs[0]), sl, sr))
            elif inner.data == "template_else":
                flat.append(("else", None, sl, sr))
            elif inner.data == "template_endif":
                flat.append(("endif", None, sl, sr))
            elif inner.data == "template_for_start":
                idents = [str(c.children[0]) for c in ich if isinstance(c, Tree) and c.data == "identifier"]
                flat.append(("for", (idents, self.expr(exprs[0])), sl, sr))
            elif inner.data == "template_endfor":
                flat.append(("endfor", None, sl, sr))
        # strip markers trim whitespace of the neighbouring literal text
        for i, (kind, _payload, sl, sr) in enumerate(flat):
            if kind == "lit":
                continue
            if sl and i > 0 and flat[i - 1][0] == "lit":
                k, p, a, b = flat[i - 1]
                flat[i - 1] = (k, str(p).rstrip(), a, b)
            if sr and i + 1 < len(flat) and flat[i + 1][0] == "lit":
                k, p, a, b = flat[i + 1]
                flat[i + 1] = (k, str(p).lstrip(), a, b)
        pos = 0

        def seq(stop: tuple[str, ...]) -> tuple[list[A.TemplatePart], str]:
            nonlocal pos
            out: list[A.TemplatePart] = []
            while pos < len(flat):
                kind, payload, _sl, _sr = flat[pos]
                pos += 1
                if kind in stop:
                    return out, kind
                if kind == "lit":
                    if out and isinstance(out[-1], str):
                        out[-1] += payload
                    else:
                        out.append(payload)
                elif kind == "expr":
                    out.append(payload)
                elif kind == "if":
                    then, end = seq(("else", "endif"))
                    otherwise: list[A.TemplatePart] = []
                    if end == "else":
                        otherwise, end = seq(("endif",))
                    if end != "endif":
                        raise EvalError("Invalid template", '"%{if}" has no matching "%{endif}".', self.rng(node))
                    out.append(A.TemplateIf(payload, then, otherwise))
                elif kind == "for":
                    idents, coll = payload
                    body, end = seq(("endfor",))
                    if end != "endfor":
                        raise EvalError("Invalid template", '"%{for}" has no matching "%{endfor}".',
                                        self.rng(node))
                    kv, vv = (idents[0], idents[1]) if len(idents) == 2 else (None, idents[0])
                    out.append(A.TemplateFor(kv, vv, coll, body))
                else:
                    raise EvalError("Invalid template", f'Unexpected "%{{{kind}}}" in a string template.',
                                    self.rng(node))
            return out, ""

        parts, _ = seq(())
        return parts

    def heredoc(self, tok: Token, trim: bool) -> A.Expr:
        """A heredoc: literal lines with ``${...}`` interpolations (directives unsupported)."""
        rng = self.rng(tok)
        lines = str(tok).rstrip("\r\n").split("\n")
        body_lines = [ln.rstrip("\r") for ln in lines[1:-1]]
        if trim:
            indents = [len(ln) - len(ln.lstrip(" \t")) for ln in body_lines if ln.strip()]
            cut = min(indents, default=0)
            body_lines = [ln[cut:] for ln in body_lines]
        text = "".join(ln + "\n" for ln in body_lines)
        parts: list[A.TemplatePart] = []
        i, lit, line = 0, "", rng.line + 1
        while i < len(text):
            if text.startswith(("$${", "%%{"), i):
                lit += text[i + 1:i + 3]
                i += 3
                continue
            if text.startswith("%{", i):
                raise EvalError("Unsupported template directive",
                                "Template directives (%{if}, %{for}) are supported in quoted strings only, "
                                "not in heredocs.", rng)
            if text.startswith("${", i):
                end = _match_brace(text, i + 2)
                if end < 0:
                    raise EvalError("Invalid template", 'A "${" in this heredoc is never closed.', rng)
                inner = text[i + 2:end]
                line_here = line + text.count("\n", 0, i)
                parts.append(lit) if lit else None
                lit = ""
                parts.append(self._sub_expr(inner, line_here))
                i = end + 1
                continue
            lit += text[i]
            i += 1
        if lit:
            parts.append(lit)
        if all(isinstance(p, str) for p in parts):
            return A.Literal(rng, "".join(p for p in parts if isinstance(p, str)))
        return A.Template(rng, parts)

    def _sub_expr(self, source: str, line: int) -> A.Expr:
        import hcl2

        try:
            tree = hcl2.parses_to_tree("x = " + source.strip() + "\n")
        except UnexpectedInput as exc:
            d = translate_syntax_error(exc, source, self.filename)
            raise EvalError(d.summary, d.detail, SourceRange(self.filename, line, 1)) from None
        attr = tree.children[0].children
        attrs = [c for c in attr if isinstance(c, Tree) and c.data == "attribute"]
        if len(attrs) != 1:
            raise EvalError("Invalid template", "A heredoc interpolation must hold one expression.",
                            SourceRange(self.filename, line, 1))
        sub = _Converter(self.filename, line - 1, 0)
        out = sub.expr(_sig(attrs[0].children)[2])
        self.diags.extend(sub.diags)
        return out


def _match_brace(text: str, i: int) -> int:
    """Offset of the ``}`` closing a template sequence opened before ``i`` (-1 if none)."""
    depth = 1
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1
