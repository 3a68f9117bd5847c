"""Walk the overlays' code and record every vLLM name it relies on.

The walker types expressions as far as annotations carry it (ours and
vLLM's), in program order, one function at a time. Whenever code that is
ours (a new file, or a line inside an injected region) reaches a name that
vLLM defines, it records a ``Use``: a module or a module-level name it
imports, a member of a vLLM class it reads, writes, calls or probes
(``hasattr``/``getattr`` with a default), a vLLM method it overrides, the
abstract methods of a vLLM base it implements, and, for injected code, each
local of the surrounding vLLM function it reads. Accesses on a value of
unknown type whose name looks like vLLM's are kept apart as ``unresolved``:
a scan with any is not a complete list, and the caller says so.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

from .index import Index, Member, Sym, is_static, params_of
from .types import (
    UNKNOWN,
    Annotations,
    ClassObj,
    Func,
    Gen,
    Inst,
    ModuleObj,
    Outside,
    T,
    element,
    item,
)


@dataclass
class Use:
    kind: str  # module | name | member | local | abstract
    module: str = ""  # the module reached (module, name, member, abstract)
    name: str = ""  # module-level name; the class for member/abstract
    member: str = ""
    is_: str = (
        ""  # what it is: class, function, value, method, property, attribute, ...
    )
    defined_in: str = ""  # member: the class that defines it (a base, possibly)
    file: str = ""  # local: the vLLM file
    scope: str = ""  # local: "class X/def f" ("" at module level)
    present: bool = True
    params: list[str] = field(default_factory=list)  # positional names we pass
    keywords: list[str] = field(default_factory=list)
    signature: list[str] | None = None  # an override: the exact parameters
    methods: list[str] = field(default_factory=list)  # abstract: the set
    type: str = ""  # a name the definition must mention (we use its type)
    annotation: str = ""  # its declared type, or a callable's return type, as written
    sites: set[str] = field(default_factory=set)

    def key(self) -> tuple[str, ...]:
        return (self.kind, self.module, self.name, self.member, self.file, self.scope)


@dataclass
class Unresolved:
    name: str
    site: str


@dataclass(frozen=True)
class Super(T):
    cls: Sym


@dataclass
class Binding:
    type: T
    ours: bool


_BUILTIN_CONTAINERS = {
    "list": "list",
    "tuple": "list",
    "sorted": "list",
    "set": "set",
    "reversed": "list",
}


class Walker:
    def __init__(self, index: Index, site_of):
        self.index = index
        self.ann = Annotations(index)
        self.site_of = site_of  # (path, line) -> "overlay/file:line" or None
        self.uses: dict[tuple[str, ...], Use] = {}
        self.unresolved: list[Unresolved] = []
        self._global_cache: dict[tuple[str, str], T] = {}
        # (class, attribute) -> the type of what a method assigned to self.<attribute>
        self.attr_types: dict[tuple[Sym, str], T] = {}

    # -- recording -----------------------------------------------------------

    def _use(self, use: Use, site: str) -> Use:
        have = self.uses.setdefault(use.key(), use)
        if have is not use:  # one name reached from several sites: what each needs
            if len(use.params) > len(have.params):
                have.params = use.params
            have.keywords = sorted(set(have.keywords) | set(use.keywords))
            for f in ("is_", "defined_in", "type", "annotation"):
                if not getattr(have, f):
                    setattr(have, f, getattr(use, f))
            if have.signature is None:
                have.signature = use.signature
            have.present = have.present or use.present
        have.sites.add(site)
        return have

    def _site(self, node: ast.AST) -> str | None:
        line = getattr(node, "lineno", None)
        return None if line is None else self.site_of(self.path, line)

    def _vllm(self, path: str, line: int) -> bool:
        return not self.index.is_ours(path, line)

    # -- entry points ----------------------------------------------------------

    def scan(self, module: str) -> None:
        """Every statement of ``module``; uses are recorded at our lines only."""
        mod = self.index.module(module)
        if mod is None:
            return
        self.mod, self.path = mod, mod.path
        env: dict[str, Binding] = {}
        self._block(mod.tree.body, env, cls=None, func=None, scope="")

    # -- statements ------------------------------------------------------------

    def _block(self, body, env, cls, func, scope) -> bool:
        """Walks the statements; True when the block ends the code path (a
        return or raise), so what follows it in the enclosing block is dead."""
        for stmt in body:
            if self._stmt(stmt, env, cls, func, scope):
                return True
        return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise))

    def _stmt(self, s: ast.stmt, env, cls, func, scope) -> bool:
        """Walks one statement; True when the code after it cannot run in
        this release (it returned inside the branch a release probe takes)."""
        if isinstance(s, ast.If):
            known = self._probe_value(s.test, env)
            if known is not None:
                # ``if hasattr(base, "DevicePointers"):`` and the like: a
                # release runs one branch only, and only that one is scanned.
                self._expr(s.test, env, cls, func, scope)
                return self._block(s.body if known else s.orelse, env, cls, func, scope)
        site = self._site(s)
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            self._import(s, env, site)
        elif isinstance(s, ast.ClassDef):
            self._class(s, env, site, scope)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._function(s, env, cls, scope)
        elif isinstance(s, ast.Assign):
            t = self._expr(s.value, env, cls, func, scope)
            for target in s.targets:
                self._assign(target, t, env, cls, func, scope, site is not None)
        elif isinstance(s, ast.AnnAssign):
            t = self.ann.of(s.annotation, self.mod.name)
            if s.value is not None:
                vt = self._expr(s.value, env, cls, func, scope)
                if t == UNKNOWN:
                    t = vt
            self._assign(s.target, t, env, cls, func, scope, site is not None)
        elif isinstance(s, ast.AugAssign):
            self._expr(s.value, env, cls, func, scope)
            self._expr(s.target, env, cls, func, scope, store=True)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            t = self._expr(s.iter, env, cls, func, scope)
            self._assign(s.target, element(t), env, cls, func, scope, site is not None)
            self._block(s.body, env, cls, func, scope)
            self._block(s.orelse, env, cls, func, scope)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for w in s.items:
                t = self._expr(w.context_expr, env, cls, func, scope)
                if w.optional_vars is not None:
                    self._assign(
                        w.optional_vars,
                        UNKNOWN if isinstance(t, Inst) else t,
                        env,
                        cls,
                        func,
                        scope,
                        site is not None,
                    )
            self._block(s.body, env, cls, func, scope)
        elif isinstance(s, ast.If):
            self._expr(s.test, env, cls, func, scope)
            narrowed = self._narrow(s.test, env)
            self._block(s.body, narrowed, cls, func, scope)
            # what the branch bound: new names, and known types for unknown ones
            env.update(
                {
                    k: v
                    for k, v in narrowed.items()
                    if k not in env or env[k].type == UNKNOWN
                }
            )
            negated = (
                s.test.operand
                if isinstance(s.test, ast.UnaryOp) and isinstance(s.test.op, ast.Not)
                else None
            )
            if negated is not None:
                # ``if not isinstance(x, C): return ...``: x is a C below
                after = self._narrow(negated, env)
                self._block(s.orelse, after, cls, func, scope)
                if s.body and isinstance(
                    s.body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break)
                ):
                    env.update(after)
            else:
                self._block(s.orelse, env, cls, func, scope)
        elif isinstance(s, ast.While):
            self._expr(s.test, env, cls, func, scope)
            self._block(s.body, env, cls, func, scope)
            self._block(s.orelse, env, cls, func, scope)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            self._block(s.body, env, cls, func, scope)
            for h in s.handlers:
                if h.type is not None:
                    self._expr(h.type, env, cls, func, scope)
                if h.name:
                    env[h.name] = Binding(UNKNOWN, site is not None)
                self._block(h.body, env, cls, func, scope)
            self._block(s.orelse, env, cls, func, scope)
            self._block(s.finalbody, env, cls, func, scope)
        elif isinstance(s, ast.Match):
            self._expr(s.subject, env, cls, func, scope)
            for case in s.cases:
                self._block(case.body, env, cls, func, scope)
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self._expr(child, env, cls, func, scope)

    def _probe_value(self, test: ast.expr, env) -> bool | None:
        """``hasattr(x, "name")`` (or ``not`` it) whose answer this release
        decides: x a vLLM class, instance or module. None otherwise."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._probe_value(test.operand, env)
            return None if inner is None else not inner
        if not (
            isinstance(test, ast.Call)
            and isinstance(test.func, ast.Name)
            and test.func.id == "hasattr"
            and len(test.args) == 2
            and isinstance(test.args[1], ast.Constant)
            and isinstance(test.args[1].value, str)
        ):
            return None
        head = self._type_silent(test.args[0], env)
        name = test.args[1].value
        if isinstance(head, (Inst, ClassObj)) and self._class_is_vllm(head.cls):
            return self.index.member(head.cls, name) is not None
        if isinstance(head, ModuleObj) and self._tree_module(head.name):
            _, node = self.index.resolve(head.name, name)
            return node is not None or self.index.exists(f"{head.name}.{name}")
        return None

    def _narrow(self, test: ast.expr, env) -> dict[str, Binding]:
        """``if isinstance(x, C):`` -> x is a C in the body."""
        out = dict(env)
        for t in (
            test.values
            if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)
            else [test]
        ):
            if (
                isinstance(t, ast.Call)
                and isinstance(t.func, ast.Name)
                and t.func.id == "isinstance"
                and len(t.args) == 2
                and isinstance(t.args[0], ast.Name)
            ):
                kinds = (
                    t.args[1].elts if isinstance(t.args[1], ast.Tuple) else [t.args[1]]
                )
                ct = self._type_silent(kinds[0], env)
                if isinstance(ct, ClassObj):
                    old = env.get(t.args[0].id)
                    out[t.args[0].id] = Binding(Inst(ct.cls), old.ours if old else True)
        return out

    def _type_silent(self, e: ast.expr, env) -> T:
        if isinstance(e, ast.Name):
            b = env.get(e.id)
            return b.type if b else self._global(self.mod.name, e.id)
        if isinstance(e, ast.Attribute):
            head = self._type_silent(e.value, env)
            if isinstance(head, ModuleObj):
                return self._global(head.name, e.attr)
        return UNKNOWN

    def _import(self, s, env, site) -> None:
        if isinstance(s, ast.Import):
            for a in s.names:
                local = a.asname or a.name.split(".")[0]
                env[local] = Binding(
                    ModuleObj(a.name if a.asname else local), site is not None
                )
                if site is not None and self._tree_module(a.name):
                    self._use(Use("module", module=a.name), site)
            return
        from .index import resolve_relative

        src = resolve_relative(
            self.mod.name, self.mod.path.endswith("__init__.py"), s.module, s.level
        )
        for a in s.names:
            if a.name == "*":
                continue
            t = self._global(src, a.name)
            env[a.asname or a.name] = Binding(t, site is not None)
            if site is None:
                continue
            sub = f"{src}.{a.name}"
            if self.index.exists(sub):
                if self._tree_module(sub):
                    self._use(Use("module", module=sub), site)
            elif self._tree_module(src):
                where, node = self.index.resolve(src, a.name)
                if node is not None or self.index.exists(where.module):
                    self._use(
                        Use("name", module=src, name=a.name, is_=_what(node)), site
                    )
                else:
                    self._missing(f"{src}.{a.name}", site)

    def _tree_module(self, name: str) -> bool:
        """A module of the tree that is not ours."""
        mod = self.index.module(name)
        return mod is not None and self._vllm(mod.path, 1)

    def _class(self, s: ast.ClassDef, env, site, scope) -> None:
        sym = Sym(self.mod.name, s.name) if not scope else Sym(self.mod.name, s.name)
        env[s.name] = Binding(ClassObj(sym), site is not None)
        for b in s.bases:
            self._expr(b, env, None, None, scope)
        inner = f"{scope}/class {s.name}" if scope else f"class {s.name}"
        if site is not None:
            self._subclass(sym, s, site)
        cenv = dict(env)
        self._block(s.body, cenv, sym, None, inner)

    def _subclass(self, sym: Sym, s: ast.ClassDef, site: str) -> None:
        """Our class over a vLLM base: the base's abstract methods, and the
        signature of each base method we override."""
        for base in self.index.bases(sym):
            node = self.index.class_node(base)
            if node is None:
                continue
            where, _ = self.index.resolve(base.module, base.name)
            bmod = self.index.module(where.module)
            if bmod is None or not self._vllm(bmod.path, node.lineno):
                continue
            self._use(
                Use(
                    "abstract",
                    module=where.module,
                    name=where.name,
                    methods=self.index.abstract_methods(where),
                ),
                site,
            )
        for stmt in s.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                stmt.name == "__init__" or not stmt.name.startswith("__")
            ):
                self._override(sym, stmt)

    def _override(self, owner: Sym, fn) -> None:
        site = self.site_of(self.path, fn.lineno)
        if site is None:
            return
        for base in self.index.bases(owner):
            m = self.index.member(base, fn.name)
            if (
                m is None
                or not self._vllm(m.path, m.line)
                or m.kind not in ("method", "property")
            ):
                continue
            sig = (
                params_of(m.node, not is_static(m.node)) if m.kind == "method" else None
            )
            self._use(
                Use(
                    "member", module=m.owner.module, name=m.owner.name, member=fn.name,
                    is_=m.kind, defined_in=m.owner.dotted, signature=sig,
                ),
                site,
            )  # fmt: skip
            return

    def _function(self, fn, env, cls, scope) -> None:
        inner = f"{scope}/def {fn.name}" if scope else f"def {fn.name}"
        for d in fn.decorator_list:
            self._expr(d, env, cls, None, scope)
        if cls is not None and self._vllm(self.path, fn.lineno) is False:
            # a method injected into a vLLM class overrides its base's
            node = self.index.class_node(cls)
            if node is not None and self._vllm(self.path, node.lineno):
                self._override(cls, fn)
        fenv = dict(env)
        a = fn.args
        allp = a.posonlyargs + a.args
        ours = self._site(fn) is not None
        static = is_static(fn)
        for i, p in enumerate(allp + a.kwonlyargs):
            t = self.ann.of(p.annotation, self.mod.name)
            if i == 0 and cls is not None and not static and p in allp:
                classm = any(
                    getattr(d, "id", "") == "classmethod" for d in fn.decorator_list
                )
                t = ClassObj(cls) if classm else Inst(cls)
            fenv[p.arg] = Binding(t, ours)
        for p in (a.vararg, a.kwarg):
            if p is not None:
                fenv[p.arg] = Binding(UNKNOWN, ours)
        for default in a.defaults + [d for d in a.kw_defaults if d is not None]:
            self._expr(default, env, cls, None, scope)
        self._block(fn.body, fenv, cls, fn, inner)

    def _assign(self, target, t: T, env, cls, func, scope, ours: bool) -> None:
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and cls is not None
            and t not in (UNKNOWN, Outside("None"))
        ):
            self.attr_types.setdefault((cls, target.attr), t)
        if isinstance(target, ast.Name):
            env[target.id] = Binding(t, ours)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, e in enumerate(target.elts):
                if isinstance(e, ast.Starred):
                    self._assign(
                        e.value, Gen("list", (element(t),)), env, cls, func, scope, ours
                    )
                    continue
                sub = (
                    item(t, ast.Constant(i))
                    if isinstance(t, Gen) and t.origin == "tuple"
                    else element(t)
                )
                self._assign(e, sub, env, cls, func, scope, ours)
        elif isinstance(target, ast.Starred):
            self._assign(
                target.value, Gen("list", (element(t),)), env, cls, func, scope, ours
            )
        else:
            self._expr(target, env, cls, func, scope, store=True)

    # -- expressions -----------------------------------------------------------

    def _expr(self, e: ast.expr, env, cls, func, scope, store: bool = False) -> T:
        if isinstance(e, ast.Name):
            return self._name(e, env, scope, func)
        if isinstance(e, ast.Attribute):
            head = self._expr(e.value, env, cls, func, scope)
            return self._attr(head, e.attr, e, store=store)
        if isinstance(e, ast.Call):
            return self._call(e, env, cls, func, scope)
        if isinstance(e, ast.Subscript):
            head = self._expr(e.value, env, cls, func, scope)
            self._expr(e.slice, env, cls, func, scope)
            if isinstance(head, ClassObj) and self.index.is_enum(head.cls):
                return Inst(head.cls)
            if isinstance(head, ClassObj):  # Generic[X]
                return head
            if isinstance(e.slice, ast.Slice):
                return head
            return item(head, e.slice)
        if isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            cenv = dict(env)
            for g in e.generators:
                it = self._expr(g.iter, cenv, cls, func, scope)
                self._assign(
                    g.target,
                    element(it),
                    cenv,
                    cls,
                    func,
                    scope,
                    self._site(e) is not None,
                )
                for cond in g.ifs:
                    self._expr(cond, cenv, cls, func, scope)
            if isinstance(e, ast.DictComp):
                kt = self._expr(e.key, cenv, cls, func, scope)
                vt = self._expr(e.value, cenv, cls, func, scope)
                return Gen("dict", (kt, vt))
            et = self._expr(e.elt, cenv, cls, func, scope)
            return Gen("set" if isinstance(e, ast.SetComp) else "list", (et,))
        if isinstance(e, ast.Lambda):
            lenv = dict(env)
            for p in e.args.args:
                lenv[p.arg] = Binding(UNKNOWN, True)
            self._expr(e.body, lenv, cls, func, scope)
            return UNKNOWN
        if isinstance(e, ast.IfExp):
            self._expr(e.test, env, cls, func, scope)
            a = self._expr(e.body, self._narrow(e.test, env), cls, func, scope)
            b = self._expr(e.orelse, env, cls, func, scope)
            return a if a != UNKNOWN and a != Outside("None") else b
        if isinstance(e, ast.BoolOp):
            ts, benv = [], env
            for v in e.values:
                ts.append(self._expr(v, benv, cls, func, scope))
                if isinstance(e.op, ast.And):
                    benv = self._narrow(v, benv)
            return next((t for t in reversed(ts) if t != UNKNOWN), UNKNOWN)
        if isinstance(e, ast.NamedExpr):
            t = self._expr(e.value, env, cls, func, scope)
            self._assign(e.target, t, env, cls, func, scope, self._site(e) is not None)
            return t
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            ts = tuple(self._expr(x, env, cls, func, scope) for x in e.elts)
            if isinstance(e, ast.Tuple):
                return Gen("tuple", ts)
            return Gen("list", (ts[0] if ts else UNKNOWN,))
        if isinstance(e, ast.Dict):
            for k in e.keys:
                if k is not None:
                    self._expr(k, env, cls, func, scope)
            vs = [self._expr(v, env, cls, func, scope) for v in e.values]
            return Gen("dict", (UNKNOWN, vs[0] if vs else UNKNOWN))
        if isinstance(e, ast.Constant):
            return Outside("None" if e.value is None else type(e.value).__name__)
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.expr):
                self._expr(child, env, cls, func, scope)
            elif isinstance(child, ast.comprehension):
                pass
        return UNKNOWN

    def _name(self, e: ast.Name, env, scope, func) -> T:
        b = env.get(e.id)
        site = self._site(e)
        if b is not None:
            if (
                site is not None
                and not b.ours
                and isinstance(e.ctx, ast.Load)
                and e.id not in ("self", "cls")
            ):
                # injected code reading a local (or a module name) of vLLM's;
                # a module-level name the function does not rebind is pinned
                # at module level, where the file binds it
                local = func is not None and not (
                    e.id in self.mod.defs | self.mod.imports.keys()
                    and not _binds(func, e.id)
                )
                self._use(
                    Use(
                        "local", file=self.path, scope=scope if local else "", name=e.id
                    ),
                    site,
                )
            return b.type
        t = self._global(self.mod.name, e.id)
        if site is not None and e.id in self.mod.defs | self.mod.imports.keys():
            node = self.mod.defs.get(e.id)
            line = (
                getattr(node, "lineno", 0)
                if node is not None
                else self._import_line(e.id)
            )
            if line and self._vllm(self.path, line) and isinstance(e.ctx, ast.Load):
                self._use(Use("local", file=self.path, scope="", name=e.id), site)
        return t

    def _import_line(self, name: str) -> int:
        for node in ast.walk(self.mod.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if (a.asname or a.name.split(".")[0]) == name:
                        return node.lineno
        return 0

    def _global(self, module: str, name: str) -> T:
        key = (module, name)
        if key in self._global_cache:
            return self._global_cache[key]
        self._global_cache[key] = UNKNOWN  # recursion guard
        t = self._global_uncached(module, name)
        self._global_cache[key] = t
        return t

    def _global_uncached(self, module: str, name: str) -> T:
        mod = self.index.module(module)
        if mod is None:
            return Outside(f"{module}.{name}") if module else Outside(name)
        sym, node = self.index.resolve(module, name)
        if node is None:
            if not sym.name and self.index.exists(sym.module):
                return ModuleObj(sym.module)
            if not sym.name:
                return Outside(sym.module)
            if not self.index.exists(sym.module):
                return Outside(sym.dotted)
            return UNKNOWN
        if isinstance(node, ast.ClassDef):
            return ClassObj(sym)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Func(sym)
        if isinstance(node, ast.AnnAssign):
            return self.ann.of(node.annotation, sym.module)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            return self._call_result(sym.module, node.value)
        return UNKNOWN

    def _attr(
        self,
        head: T,
        attr: str,
        e: ast.expr,
        store: bool = False,
        probe: bool | None = None,
    ) -> T:
        """``head.attr``; probe: None (a plain access), True/False (hasattr/getattr
        with a default: whether the release has it is what we record)."""
        site = self._site(e)
        if attr.startswith("__") and attr.endswith("__"):
            return UNKNOWN  # Python's own (__dict__, __name__, ...)
        if isinstance(head, Super):
            for base in self.index.bases(head.cls):
                m = self.index.member(base, attr)
                if m is not None:
                    return self._member_use(base, m, site, probe)
            return UNKNOWN
        if isinstance(head, (Inst, ClassObj)):
            m = self.index.member(head.cls, attr)
            if m is None:
                if self.index.outside_base(head.cls) or (
                    self.index.is_enum(head.cls) and attr in ("name", "value")
                ):
                    return UNKNOWN  # Python's (logging.Logger's, Enum's) member
                if site is not None and self._class_is_vllm(head.cls):
                    if probe is not None or store:
                        # probed, or set by us: we rely on vLLM not having it
                        self._use(
                            Use(
                                "member",
                                module=head.cls.module,
                                name=head.cls.name,
                                member=attr,
                                present=False,
                            ),
                            site,
                        )
                    else:
                        self._missing(f"{head.cls.dotted}.{attr}", site)
                return UNKNOWN
            return self._member_use(head.cls, m, site, probe, store)
        if isinstance(head, ModuleObj):
            t = self._global(head.name, attr)
            if site is not None and self._tree_module(head.name):
                sub = f"{head.name}.{attr}"
                if self._tree_module(sub):
                    self._use(Use("module", module=sub), site)
                else:
                    _, node = self.index.resolve(head.name, attr)
                    if node is None and probe is None:
                        self._missing(sub, site)
                    self._use(
                        Use(
                            "name",
                            module=head.name,
                            name=attr,
                            is_=_what(node),
                            present=node is not None,
                        ),
                        site,
                    )
            return t
        if head == UNKNOWN and site is not None:
            self.unresolved.append(Unresolved(attr, site))
        return UNKNOWN

    def _class_is_vllm(self, cls: Sym) -> bool:
        node = self.index.class_node(cls)
        if node is None:
            return False
        where, _ = self.index.resolve(cls.module, cls.name)
        mod = self.index.module(where.module)
        return mod is not None and self._vllm(mod.path, node.lineno)

    def _member_use(
        self, reached: Sym, m: Member, site: str | None, probe, store: bool = False
    ) -> T:
        t = self._member_type(m)
        if site is not None and self._vllm(m.path, m.line):
            where, _ = self.index.resolve(reached.module, reached.name)
            self._use(
                Use(
                    "member", module=where.module, name=where.name, member=m.name,
                    is_=m.kind, defined_in=m.owner.dotted,
                    type=_type_name(t) if m.kind in ("attribute", "property") else "",
                    annotation=_annotation(m),
                ),
                site,
            )  # fmt: skip
        if m.kind == "method":
            return Func(
                Sym(m.owner.module, f"{m.owner.name}.{m.name}"),
                owner=reached,
                method=m.name,
            )
        return t

    def _member_type(self, m: Member) -> T:
        if m.kind == "class":
            return ClassObj(Sym(m.owner.module, f"{m.owner.name}.{m.name}"))
        if m.kind == "enum-member":
            return Inst(m.owner)
        if m.annotation is not None:
            t = self.ann.of(m.annotation, m.owner.module)
            if t != UNKNOWN:
                return t
        seen = self.attr_types.get((m.owner, m.name))
        if seen is not None:
            return seen
        if m.value is not None:
            return self._value_type(m)
        return UNKNOWN

    def _value_type(self, m: Member) -> T:
        """The type of ``self.x = <value>`` without walking the method: a
        constructor call, or an annotated parameter of the method."""
        v = m.value
        if isinstance(v, ast.Call):
            return self._call_result(m.owner.module, v)
        if isinstance(v, ast.Name) and m.method is not None:
            for p in m.method.args.args + m.method.args.kwonlyargs:
                if p.arg == v.id:
                    return self.ann.of(p.annotation, m.owner.module)
        return UNKNOWN

    def _call_result(self, module: str, v: ast.Call) -> T:
        """What a call of a module-level name returns, without walking: an
        instance of a class (ours, vLLM's or Python's), or a function's
        annotated result."""
        sym = self.index.name_of(module, v.func)
        if sym is None:
            return UNKNOWN
        t = self.ann.instance(sym)
        if t != UNKNOWN:
            return t
        if "." in sym.name:  # Class.factory(...)
            owner, _, meth = sym.name.rpartition(".")
            m = self.index.member(Sym(sym.module, owner), meth)
            if m is not None and isinstance(
                m.node, (ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                t = self.ann.of(m.node.returns, m.owner.module)
                if (
                    t == UNKNOWN
                    and m.node.returns is not None
                    and ast.unparse(m.node.returns) in ("Self", "'Self'")
                ):
                    return Inst(m.owner)
                return t
        _, node = self.index.resolve(sym.module, sym.name) if sym.name else (sym, None)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return self.ann.of(node.returns, sym.module)
        return UNKNOWN

    def _call(self, e: ast.Call, env, cls, func, scope) -> T:
        f = e.func
        if (
            isinstance(f, ast.Name)
            and f.id in ("getattr", "hasattr")
            and len(e.args) >= 2
            and f.id not in env
        ):
            head = self._expr(e.args[0], env, cls, func, scope)
            for extra in e.args[2:]:
                self._expr(extra, env, cls, func, scope)
            name = e.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                probe = f.id == "hasattr" or len(e.args) > 2
                t = self._attr(head, name.value, e, probe=True if probe else None)
                return Outside("bool") if f.id == "hasattr" else t
            return UNKNOWN
        if (
            isinstance(f, ast.Name)
            and f.id == "super"
            and f.id not in env
            and cls is not None
        ):
            return Super(cls)
        container = None
        first = e.args[0] if e.args else None
        for k in e.keywords:
            if (
                k.arg == "key"
                and isinstance(k.value, ast.Lambda)
                and first is not None
                and k.value.args.args
            ):
                # sorted/min/max(xs, key=lambda x: ...): x is an element of xs
                xt = element(self._expr(first, env, cls, func, scope))
                lenv = dict(env)
                lenv[k.value.args.args[0].arg] = Binding(xt, True)
                self._expr(k.value.body, lenv, cls, func, scope)
        if isinstance(f, ast.Attribute):
            head = self._expr(f.value, env, cls, func, scope)
            container = _container_method(head, f.attr)
            ft = container if container is not None else self._attr(head, f.attr, f)
        else:
            ft = self._expr(f, env, cls, func, scope)
        args = [self._expr(a, env, cls, func, scope) for a in e.args]
        for k in e.keywords:
            if not (
                k.arg == "key" and isinstance(k.value, ast.Lambda) and first is not None
            ):
                self._expr(k.value, env, cls, func, scope)
        if container is not None:
            return container
        if (
            isinstance(f, ast.Name)
            and f.id not in env
            and f.id not in self.mod.defs
            and f.id not in self.mod.imports
        ):
            return self._builtin(f.id, e, args)
        if isinstance(ft, (Func, ClassObj)):
            return self._callee(ft, e, self._site(e))
        if isinstance(ft, Outside):  # a call of Python's, torch's, ...
            return Outside(f"{ft.name}()")
        return UNKNOWN

    def _builtin(self, name: str, e: ast.Call, args: list[T]) -> T:
        if name in _BUILTIN_CONTAINERS and args:
            return Gen(_BUILTIN_CONTAINERS[name], (element(args[0]),))
        if name == "next" and args:
            return element(args[0])
        if name == "iter" and args:
            return Gen("iter", (element(args[0]),))
        if name == "enumerate" and args:
            return Gen("iter", (Gen("tuple", (Outside("int"), element(args[0]))),))
        if name == "zip":
            return Gen("iter", (Gen("tuple", tuple(element(a) for a in args)),))
        if name == "cast" and args:
            t = (
                self._type_silent(e.args[0], {})
                if isinstance(e.args[0], (ast.Name, ast.Attribute))
                else UNKNOWN
            )
            if isinstance(e.args[0], ast.Constant):
                t = self.ann.of(e.args[0], self.mod.name)
            return Inst(t.cls) if isinstance(t, ClassObj) else t
        if name in ("len", "int", "str", "bool", "float", "isinstance", "id", "repr"):
            return Outside(name)
        return UNKNOWN

    def _callee(self, ft: Func | ClassObj, e: ast.Call, site: str | None) -> T:
        positional = len([a for a in e.args if not isinstance(a, ast.Starred)])
        keywords = sorted(k.arg for k in e.keywords if k.arg is not None)
        if isinstance(ft, ClassObj):
            init = self.index.member(ft.cls, "__init__")
            fields = None if init is not None else self._dataclass_fields(ft.cls)
            if site is not None and self._class_is_vllm(ft.cls):
                if (
                    init is not None
                    and self._vllm(init.path, init.line)
                    and isinstance(init.node, ast.FunctionDef)
                ):
                    names = params_of(init.node, True)
                    self._call_use(
                        init.owner, "__init__", names, positional, keywords, site
                    )
                elif fields is not None:
                    self._call_use(
                        ft.cls, "__init__", fields, positional, keywords, site
                    )
            return Inst(ft.cls)
        owner_name = ft.sym.name.rsplit(".", 1)
        if len(owner_name) == 2:  # a method
            cls = Sym(ft.sym.module, owner_name[0])
            m = self.index.member(cls, owner_name[1])
            if m is None or not isinstance(
                m.node, (ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                return UNKNOWN
            if site is not None and self._vllm(m.path, m.line):
                names = params_of(m.node, not is_static(m.node))
                self._call_use(m.owner, m.name, names, positional, keywords, site)
            return self.ann.of(m.node.returns, m.owner.module)
        sym, node = self.index.resolve(ft.sym.module, ft.sym.name)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return UNKNOWN
        mod = self.index.module(sym.module)
        if site is not None and mod is not None and self._vllm(mod.path, node.lineno):
            names = params_of(node, False)
            self._use(
                Use("name", module=sym.module, name=sym.name, is_="function",
                    params=_positional(names, positional), keywords=keywords,
                    annotation="" if node.returns is None else ast.unparse(node.returns)),
                site,
            )  # fmt: skip
        return self.ann.of(node.returns, sym.module)

    def _call_use(
        self, owner: Sym, member: str, names, positional, keywords, site
    ) -> None:
        use = self._use(
            Use(
                "member",
                module=owner.module,
                name=owner.name,
                member=member,
                is_="method",
                defined_in=owner.dotted,
            ),
            site,
        )
        p = _positional(names, positional)
        if len(p) > len(use.params):
            use.params = p
        use.keywords = sorted(set(use.keywords) | set(keywords))

    def _dataclass_fields(self, cls: Sym) -> list[str] | None:
        """A dataclass's or NamedTuple's constructor parameters: its fields."""
        node = self.index.class_node(cls)
        if node is None:
            return None
        marks = [ast.unparse(d) for d in node.decorator_list] + [
            ast.unparse(b) for b in node.bases
        ]
        if not any("dataclass" in m or "NamedTuple" in m for m in marks):
            return None
        out = []
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if "ClassVar" in ast.unparse(stmt.annotation):
                    continue
                if isinstance(stmt.value, ast.Call) and "init=False" in ast.unparse(
                    stmt.value
                ):
                    continue
                out.append(stmt.target.id)
        return out

    def _missing(self, dotted: str, site: str) -> None:
        self.unresolved.append(Unresolved(f"{dotted} (not in this release)", site))


def _container_method(head: T, attr: str) -> T | None:
    """The result of ``head.attr()`` for a dict or list method, else None."""
    if isinstance(head, Gen) and head.origin == "dict" and len(head.args) == 2:
        k, v = head.args
        return {
            "values": Gen("list", (v,)), "keys": Gen("list", (k,)),
            "items": Gen("list", (Gen("tuple", (k, v)),)), "get": v, "pop": v,
            "copy": head, "setdefault": v,
        }.get(attr)  # fmt: skip
    if isinstance(head, Gen) and head.origin in ("list", "set"):
        return {"pop": element(head), "popleft": element(head), "copy": head}.get(attr)
    return None


def _positional(names: list[str], n: int) -> list[str]:
    plain = [x for x in names if not x.startswith("*")]
    return plain[:n]


def _what(node: ast.AST | None) -> str:
    if isinstance(node, ast.ClassDef):
        return "class"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "function"
    if node is None:
        return ""
    return "value"


def _annotation(m: Member) -> str:
    """A member's declared type (a property's or method's: its return type)."""
    node = m.annotation
    if m.kind in ("method", "property") and isinstance(
        m.node, (ast.FunctionDef, ast.AsyncFunctionDef)
    ):
        node = m.node.returns
    return "" if node is None else ast.unparse(node)


def _type_name(t: T) -> str:
    """The bare name of a class the scan typed a member as (pinned, so a
    definition that now holds another type is drift)."""
    if isinstance(t, Inst):
        return t.cls.name.rsplit(".", 1)[-1]
    return ""


_PYTHON_NAMES = frozenset(
    n
    for t in (str, bytes, list, dict, set, tuple, int, float, object, BaseException)
    for n in dir(t)
)


def vllm_looking(
    index: Index, unresolved: list[Unresolved], also: Iterable[str] = ()
) -> list[Unresolved]:
    """The unresolved accesses whose name a class of the modules ``also``
    names (the pinned files: those the overlays patch or name) defines (minus
    the members of Python's own types): where a scan may have missed a vLLM
    name for want of a type. Only those modules: the index also holds every
    module a patched file imports (vllm/config/vllm.py alone pulls in the
    compilation, multimodal and sampling modules), whose common member names
    (key, length, shape) would flag our own objects' attributes."""
    names: set[str] = set()
    for name in also:
        mod = index.module(name)
        if mod is None or index.is_ours(mod.path, 1):
            continue
        for node in ast.walk(mod.tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(
                    sub.target, ast.Name
                ):
                    names.add(sub.target.id)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.attr)
    return [
        u
        for u in unresolved
        if "(" in u.name or (u.name in names and u.name not in _PYTHON_NAMES)
    ]


def _binds(func: ast.AST, name: str) -> bool:
    """Whether ``name`` is a parameter of ``func`` or bound in its body."""
    a = func.args
    params = a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
    if any(p is not None and p.arg == name for p in params):
        return True
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            if node.id == name:
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((x.asname or x.name.split(".")[0]) == name for x in node.names):
                return True
        elif isinstance(node, ast.ExceptHandler) and node.name == name:
            return True
    return False
