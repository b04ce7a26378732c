#!/usr/bin/env python3
"""code_walk.py - how far a reader climbs around the code following the parsed spec.

Needs Debian's libclang1-14 (apt-get install libclang1-14; not a build or
test dependency) and a build tree with the generated Cap'n Proto headers.
Figures and their definitions: bench/results/house.md.

Usage:  python3 bench/code_walk.py TREE [--build DIR] [--root NAME] [--seed TYPE]
                                       [--jobs N] [--list] [--json FILE]

TREE is a checkout of troupe (a git archive, a worktree, /work/main ...).
It parses every .cpp under TREE/{launch,actors,rl,model,moe,kernels} with
libclang (LLVM 14, through ctypes: no python bindings needed), builds the static
reference graph of the project's functions, derives the "spec-carrying" types
from troupe::launch::Spec by a mechanical rule, and walks depth-first from
troupe::launch::command_run.  `--list` prints every stop.  All definitions are
printed with the figures (and summarized in bench/results/house.md).
"""
import argparse
import collections
import ctypes
import glob
import hashlib
import json
import multiprocessing
import os
import sys

PROJECT_DIRS = ("launch", "actors", "rl", "model", "moe", "kernels")
LAYERS = ("bench", "launch", "actors", "rl", "model", "moe", "kernels")  # high -> low
LIBCLANG = "/usr/lib/llvm-14/lib/libclang-14.so.1"

# One flag set for every translation unit: the union of what build/compile_commands.json
# gives the project's targets (defines are harmless where unused).
DEFINES = ["-DCL_TARGET_OPENCL_VERSION=120", "-DFMT_SHARED", "-DSPDLOG_COMPILED_LIB", "-DSPDLOG_FMT_EXTERNAL",
           "-DSPDLOG_SHARED_LIB", '-DTROUPE_VERSION="0.1.0"', "-DNDEBUG", "-DTOML_HEADER_ONLY=0",
           "-DTOML_SHARED_LIB=1", "-DCPPHTTPLIB_OPENSSL_SUPPORT", "-DCPPHTTPLIB_ZLIB_SUPPORT",
           "-DCPPHTTPLIB_BROTLI_SUPPORT"]
MPI_INC = ["/usr/lib/x86_64-linux-gnu/openmpi/include", "/usr/lib/x86_64-linux-gnu/openmpi/include/openmpi"]

# ---------------------------------------------------------------- libclang via ctypes


class CXString(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("flags", ctypes.c_uint)]


class CXCursor(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("xdata", ctypes.c_int), ("data", ctypes.c_void_p * 3)]


class CXType(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("data", ctypes.c_void_p * 2)]


class CXSourceLocation(ctypes.Structure):
    _fields_ = [("ptr_data", ctypes.c_void_p * 2), ("int_data", ctypes.c_uint)]


VISITOR = ctypes.CFUNCTYPE(ctypes.c_int, CXCursor, CXCursor, ctypes.c_void_p)
lib = None


def load_lib():
    global lib
    lib = ctypes.CDLL(LIBCLANG)
    sig = {
        "clang_createIndex": (ctypes.c_void_p, [ctypes.c_int, ctypes.c_int]),
        "clang_parseTranslationUnit2": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                                      ctypes.POINTER(ctypes.c_char_p), ctypes.c_int,
                                                      ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                                                      ctypes.POINTER(ctypes.c_void_p)]),
        "clang_disposeTranslationUnit": (None, [ctypes.c_void_p]),
        "clang_getTranslationUnitCursor": (CXCursor, [ctypes.c_void_p]),
        "clang_visitChildren": (ctypes.c_uint, [CXCursor, VISITOR, ctypes.c_void_p]),
        "clang_getCursorReferenced": (CXCursor, [CXCursor]),
        "clang_getSpecializedCursorTemplate": (CXCursor, [CXCursor]),
        "clang_Cursor_isNull": (ctypes.c_int, [CXCursor]),
        "clang_getCursorUSR": (CXString, [CXCursor]),
        "clang_getCursorSpelling": (CXString, [CXCursor]),
        "clang_getCursorDisplayName": (CXString, [CXCursor]),
        "clang_getCString": (ctypes.c_char_p, [CXString]),
        "clang_disposeString": (None, [CXString]),
        "clang_getCursorLocation": (CXSourceLocation, [CXCursor]),
        "clang_getExpansionLocation": (None, [CXSourceLocation, ctypes.POINTER(ctypes.c_void_p),
                                              ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                                              ctypes.POINTER(ctypes.c_uint)]),
        "clang_getFileName": (CXString, [ctypes.c_void_p]),
        "clang_isCursorDefinition": (ctypes.c_uint, [CXCursor]),
        "clang_getCursorSemanticParent": (CXCursor, [CXCursor]),
        "clang_getCursorType": (CXType, [CXCursor]),
        "clang_getCursorResultType": (CXType, [CXCursor]),
        "clang_getCanonicalType": (CXType, [CXType]),
        "clang_getPointeeType": (CXType, [CXType]),
        "clang_getArrayElementType": (CXType, [CXType]),
        "clang_getTypeDeclaration": (CXCursor, [CXType]),
        "clang_Type_getNumTemplateArguments": (ctypes.c_int, [CXType]),
        "clang_Type_getTemplateArgumentAsType": (CXType, [CXType, ctypes.c_uint]),
        "clang_CXXMethod_isVirtual": (ctypes.c_uint, [CXCursor]),
        "clang_CXXMethod_isStatic": (ctypes.c_uint, [CXCursor]),
        "clang_getNumDiagnostics": (ctypes.c_uint, [ctypes.c_void_p]),
        "clang_getDiagnostic": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_uint]),
        "clang_getDiagnosticSeverity": (ctypes.c_int, [ctypes.c_void_p]),
        "clang_formatDiagnostic": (CXString, [ctypes.c_void_p, ctypes.c_uint]),
        "clang_disposeDiagnostic": (None, [ctypes.c_void_p]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def s(cxs):
    v = lib.clang_getCString(cxs)
    out = v.decode("utf-8", "replace") if v else ""
    lib.clang_disposeString(cxs)
    return out


def _visit_all(c, recurse):
    out = []

    def visit(child, parent, data):
        out.append(child)
        return 2 if recurse else 1  # CXChildVisit_Recurse / _Continue

    lib.clang_visitChildren(c, VISITOR(visit), None)
    return out


def children(c):
    return _visit_all(c, recurse=False)


def descendants(c):
    return _visit_all(c, recurse=True)


_file_cache = {}


def loc(c):
    f = ctypes.c_void_p()
    line = ctypes.c_uint()
    col = ctypes.c_uint()
    off = ctypes.c_uint()
    lib.clang_getExpansionLocation(lib.clang_getCursorLocation(c), ctypes.byref(f), ctypes.byref(line),
                                   ctypes.byref(col), ctypes.byref(off))
    if not f.value:
        return None, 0
    name = _file_cache.get(f.value)
    if name is None:
        name = os.path.realpath(s(lib.clang_getFileName(f)))
        _file_cache[f.value] = name
    return name, line.value


# cursor kinds (Index.h, LLVM 14)
K_STRUCT, K_UNION, K_CLASS, K_FIELD, K_FUNC = 2, 3, 4, 6, 8
K_NAMESPACE, K_METHOD, K_LINKAGE, K_CTOR, K_DTOR, K_CONV = 22, 21, 23, 24, 25, 26
K_FTEMPLATE, K_CTEMPLATE, K_CTPARTIAL, K_BASE, K_PARM, K_UNEXPOSED_DECL = 30, 31, 32, 44, 10, 1
K_DECLREF, K_MEMBERREF, K_CALL = 101, 102, 103
FUNCS = {K_FUNC, K_METHOD, K_CTOR, K_DTOR, K_CONV, K_FTEMPLATE}
RECORDS = {K_STRUCT, K_UNION, K_CLASS, K_CTEMPLATE}
SCOPES = {K_NAMESPACE, K_LINKAGE, K_UNEXPOSED_DECL} | RECORDS | {K_CTPARTIAL}
# type kinds
T_POINTER, T_LREF, T_RREF, T_RECORD, T_ELAB, T_UNEXPOSED = 101, 103, 104, 105, 119, 1
T_ARRAYS = {112, 114, 115, 116}


def usr(c):
    return s(lib.clang_getCursorUSR(c))


def qualname(c):
    parts = []
    while not lib.clang_Cursor_isNull(c) and c.kind != 300:  # TranslationUnit
        if c.kind in SCOPES or c.kind in FUNCS:
            n = s(lib.clang_getCursorSpelling(c))
            parts.append(n if n else "(anon)")
        c = lib.clang_getCursorSemanticParent(c)
    parts.reverse()
    if parts and parts[0] == "troupe":
        parts = parts[1:]
    return "::".join(parts)


def type_records(t, depth=0):
    """USRs of the class types a type names: through const, &, &&, *, arrays and the
    template arguments of std containers / smart pointers / optional (any template)."""
    out = []
    if depth > 6:
        return out
    t = lib.clang_getCanonicalType(t)
    while t.kind in (T_POINTER, T_LREF, T_RREF) or t.kind in T_ARRAYS:
        t = lib.clang_getPointeeType(t) if t.kind not in T_ARRAYS else lib.clang_getArrayElementType(t)
        t = lib.clang_getCanonicalType(t)
    if t.kind in (T_RECORD, T_ELAB, T_UNEXPOSED):
        d = lib.clang_getTypeDeclaration(t)
        if not lib.clang_Cursor_isNull(d):
            tpl = lib.clang_getSpecializedCursorTemplate(d)
            u = usr(tpl if not lib.clang_Cursor_isNull(tpl) else d)
            if u:
                out.append(u)
        n = lib.clang_Type_getNumTemplateArguments(t)
        for i in range(max(n, 0)):
            out += type_records(lib.clang_Type_getTemplateArgumentAsType(t, i), depth + 1)
    return out


def referenced_function(c):
    r = lib.clang_getCursorReferenced(c)
    if lib.clang_Cursor_isNull(r) or r.kind not in FUNCS:
        return None
    tpl = lib.clang_getSpecializedCursorTemplate(r)
    if not lib.clang_Cursor_isNull(tpl) and tpl.kind in FUNCS:
        r = tpl
    return r


# ---------------------------------------------------------------- per translation unit


def parse_tu(job):
    tree, path, flags = job
    if lib is None:
        load_lib()
    _file_cache.clear()  # CXFile handles are reused by the next translation unit
    index = lib.clang_createIndex(0, 0)
    args = [a.encode() for a in flags] + [b"-x", b"c++"]
    argv = (ctypes.c_char_p * len(args))(*args)
    tu = ctypes.c_void_p()
    err = lib.clang_parseTranslationUnit2(index, path.encode(), argv, len(args), None, 0, 0x200,
                                          ctypes.byref(tu))  # KeepGoing
    if err != 0 or not tu.value:
        return {"file": path, "fatal": err, "errors": [], "functions": {}, "records": {}}
    errors = []
    for i in range(lib.clang_getNumDiagnostics(tu)):
        d = lib.clang_getDiagnostic(tu, i)
        if lib.clang_getDiagnosticSeverity(d) >= 3:
            errors.append(s(lib.clang_formatDiagnostic(d, 0x1 | 0x2)))
        lib.clang_disposeDiagnostic(d)
    prefixes = tuple(os.path.join(tree, d) + os.sep for d in PROJECT_DIRS)
    functions, records = {}, {}

    def in_project(c):
        f, _ = loc(c)
        return f is not None and f.startswith(prefixes)

    def rel(f):
        return os.path.relpath(f, tree)

    def describe(c):  # what the walk needs to know about a function declaration
        params = []
        for ch in children(c):
            if ch.kind == K_PARM:
                params += type_records(lib.clang_getCursorType(ch))
        parent = lib.clang_getCursorSemanticParent(c)
        cls = None
        if c.kind in (K_METHOD, K_CTOR, K_DTOR, K_CONV) or (c.kind == K_FTEMPLATE and parent.kind in RECORDS):
            if not (c.kind in (K_METHOD, K_FTEMPLATE) and lib.clang_CXXMethod_isStatic(c)):
                tpl = lib.clang_getSpecializedCursorTemplate(parent)
                cls = usr(tpl if not lib.clang_Cursor_isNull(tpl) else parent)
        result = type_records(lib.clang_getCursorResultType(c))
        return {"name": qualname(c), "display": s(lib.clang_getCursorDisplayName(c)), "params": params,
                "this": cls, "result": result}

    def do_function(c):
        u = usr(c)
        if not u or u in functions:
            return
        f, line = loc(c)
        info = describe(c)
        info.update(file=rel(f), line=line)
        edges = []
        seen = set()
        for d in descendants(c):
            if d.kind in (K_CALL, K_DECLREF, K_MEMBERREF):
                r = referenced_function(d)
                if r is None:
                    continue
                ru = usr(r)
                if ru and ru not in seen and ru != u:
                    seen.add(ru)
                    if in_project(r):  # declared in the project (std, caf, spdlog... are not stops)
                        edges.append(ru)
        info["edges"] = edges
        functions[u] = info

    def do_record(c):
        u = usr(c)
        if not u or u in records:
            return
        f, line = loc(c)
        fields, poly = [], False
        for ch in children(c):
            if ch.kind == K_FIELD:
                fields += type_records(lib.clang_getCursorType(ch))
            elif ch.kind == K_BASE:
                poly = True
            elif ch.kind in (K_METHOD, K_DTOR) and lib.clang_CXXMethod_isVirtual(ch):
                poly = True
        records[u] = {"name": qualname(c), "file": rel(f), "line": line, "fields": fields, "polymorphic": poly}

    def scan(c):
        for ch in children(c):
            if not in_project(ch):
                continue
            if ch.kind in FUNCS:
                if lib.clang_isCursorDefinition(ch):
                    do_function(ch)
                    # local classes / lambdas are read as part of the function
            elif ch.kind in RECORDS or ch.kind == K_CTPARTIAL:
                if lib.clang_isCursorDefinition(ch):
                    do_record(ch)
                scan(ch)
            elif ch.kind in SCOPES:
                scan(ch)

    scan(lib.clang_getTranslationUnitCursor(tu))
    lib.clang_disposeTranslationUnit(tu)
    return {"file": path, "fatal": 0, "errors": errors, "functions": functions, "records": records,
            }


# ---------------------------------------------------------------- the rule, the walk, the figures


def spec_types(records, functions, seed_names):
    """The spec-carrying types S (a fixed point of three steps):
       seed:  the type(s) named by --seed (default launch::Spec);
       parts: every project data type that is the type of a field of a type in S (through &, *,
              arrays and template arguments: vector<T>, optional<T>, shared_ptr<T>, map<K,V>...);
       made:  what launch/ turns the spec into: every project data type returned by a function
              defined under launch/ that takes a type in S (or is a non-static member of one)
              and no other project data type (numbers, enums, std::string, interfaces such as
              ClusterComm are allowed): computed from the spec and nothing else.
       "data type" = a struct/class defined under the project dirs with no base class and no
       virtual member function (interfaces, observers, exceptions, actor classes never are).
       Structs that merely hold an S type (runtime or actor state) are NOT added: the walk
       follows the spec and what launch/ turns it into, not every struct that keeps a copy."""
    data = {u for u, r in records.items() if not r["polymorphic"]}
    why = {}

    def parts(S):
        todo = sorted(S)
        while todo:
            u = todo.pop(0)
            for f in records[u]["fields"]:
                if f in data and f not in S:
                    S.add(f)
                    why[f] = "field of " + records[u]["name"]
                    todo.append(f)
        return S

    S = {u for u, r in records.items() if r["name"] in seed_names}
    for u in S:
        why[u] = "seed"
    parts(S)
    changed = True
    while changed:
        changed = False
        for fu in sorted(functions):
            fn = functions[fu]
            if not fn["file"].startswith("launch/"):
                continue
            takes = any(p in S for p in fn["params"]) or fn["this"] in S
            only = all(p in S or p not in data for p in fn["params"])
            if not (takes and only):
                continue
            for r in fn["result"]:
                if r in data and r not in S:
                    S.add(r)
                    why[r] = "returned by " + fn["name"]
                    parts(S)
                    changed = True
    return S, why


def room(fn):
    return os.path.dirname(fn["file"]) or "."


def layer(fn):
    return fn["file"].split("/")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree")
    ap.add_argument("--build", help="build dir with the generated schemas/*.capnp.h "
                    "(default TREE/build if it has them, else /work/main/build)")
    ap.add_argument("--root", default="launch::command_run")
    ap.add_argument("--seed", action="append", help="seed type (qualified without troupe::), default launch::Spec")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--list", action="store_true", help="print every stop")
    ap.add_argument("--json", help="write the stops and figures as JSON here")
    a = ap.parse_args()
    tree = os.path.realpath(a.tree)
    build = a.build
    if not build:
        build = os.path.join(tree, "build")
        if not glob.glob(os.path.join(build, "schemas", "*.capnp.h")):
            build = "/work/main/build"
    build = os.path.realpath(build)
    seeds = a.seed or ["launch::Spec"]
    flags = ["-std=c++20", "-I" + tree, "-isystem", build] + sum([["-isystem", p] for p in MPI_INC], []) + DEFINES
    files = sorted(p for d in PROJECT_DIRS for p in glob.glob(os.path.join(tree, d, "**", "*.cpp"), recursive=True))
    print(f"tree: {tree}\nbuild (generated headers): {build}\ntranslation units: {len(files)} "
          f"(.cpp under {', '.join(PROJECT_DIRS)})", flush=True)
    jobs = [(tree, f, flags) for f in files]
    cache = os.environ.get("WALK_CACHE")  # development aid: reuse a previous parse
    if cache and os.path.exists(cache):
        results = json.load(open(cache))
    elif a.jobs > 1:
        with multiprocessing.Pool(a.jobs) as pool:
            results = pool.map(parse_tu, jobs, chunksize=1)
    else:
        load_lib()
        results = [parse_tu(j) for j in jobs]
    if cache and not os.path.exists(cache):
        json.dump(results, open(cache, "w"))
    functions, records = {}, {}
    nerr = 0
    for r in results:  # sorted by file: the first definition seen wins (deterministic)
        if r["fatal"]:
            print(f"  FATAL: libclang could not parse {r['file']} (error {r['fatal']})")
        nerr += len(r["errors"])
        for e in r["errors"][:3]:
            print(f"  parse error in {os.path.relpath(r['file'], tree)}: {e}")
        for u, v in r["functions"].items():
            functions.setdefault(u, v)
        for u, v in r["records"].items():
            records.setdefault(u, v)
    print(f"parse errors: {nerr}; project function definitions: {len(functions)}; project class types: {len(records)}")

    S, why = spec_types(records, functions, {n for n in seeds})
    if not S:
        sys.exit(f"seed type {seeds} not found")

    def carries(fn):
        return any(p in S for p in fn["params"]) or fn["this"] in S

    roots = [u for u, f in functions.items() if f["name"] == a.root]
    if not roots:
        sys.exit(f"root {a.root} not found")
    root = sorted(roots)[0]

    visited, order = set(), []  # order: (usr, depth, caller usr)

    def dfs(u, depth, caller):
        visited.add(u)
        order.append((u, depth, caller))
        for v in functions[u]["edges"]:
            if v in visited or v not in functions:
                continue
            if not carries(functions[v]):
                continue
            dfs(v, depth + 1, u)

    sys.setrecursionlimit(100000)
    dfs(root, 0, None)

    stops = [functions[u] for u, _, _ in order]
    moves = climbs_room = climbs_layer = 0
    crossings = collections.Counter()
    seen_rooms = []
    for i, fn in enumerate(stops):
        if i:
            prev = stops[i - 1]
            if room(fn) != room(prev):
                moves += 1
                if room(fn) in seen_rooms:
                    climbs_room += 1
                li, lp = LAYERS.index(layer(fn)), LAYERS.index(layer(prev))
                if li < lp:
                    climbs_layer += 1
                if layer(fn) != layer(prev):
                    crossings[(layer(prev), layer(fn))] += 1
        if room(fn) not in seen_rooms:
            seen_rooms.append(room(fn))
    per_file = collections.Counter(fn["file"] for fn in stops)
    entries = collections.Counter()
    for i, fn in enumerate(stops):
        if i == 0 or stops[i - 1]["file"] != fn["file"]:
            entries[fn["file"]] += 1
    max_depth = max(d for _, d, _ in order)

    print()
    print("RULE (mechanical):")
    print(spec_types.__doc__)
    print(f"  seed: {', '.join(seeds)}; S has {len(S)} types:")
    for u in sorted(S, key=lambda x: records[x]["name"]):
        print(f"    {records[u]['name']:<40} {records[u]['file']}:{records[u]['line']}  ({why[u]})")
    print("  A function is followed if a parameter's type names a type in S (through &, *, templates),")
    print("  or it is a non-static member function / constructor of a type in S.")
    print("WALK: depth-first from", a.root, "over the project's static references (calls, constructor")
    print("  calls and function names passed as values, e.g. sys.spawn(actor_fn, ...)), in source order,")
    print("  each function once; a call resolves to the declared function (no virtual dispatch, no")
    print("  std::function targets); only functions defined under", "/".join(PROJECT_DIRS), "are stops.")
    if a.list:
        print()
        print("STOPS:")
        for i, (u, d, _) in enumerate(order):
            fn = functions[u]
            print(f"  {i + 1:3d} {'  ' * d}{fn['name']}  [{fn['file']}:{fn['line']}]")
    print()
    print(f"FIGURES for {tree}")
    print(f"  stops (functions visited):                 {len(stops)}")
    print(f"  files:                                     {len(per_file)}")
    print(f"  rooms (folders):                           {len(seen_rooms)}")
    print(f"  deepest call depth:                        {max_depth}")
    print(f"  moves (consecutive stops, different room): {moves}")
    print(f"  climbs back up, room seen before:          {climbs_room}")
    print(f"  climbs back up, to a higher layer:         {climbs_layer}   (layers {' > '.join(LAYERS)})")
    print(f"  launch -> actors crossings:                {crossings[('launch', 'actors')]}")
    print(f"  actors -> launch crossings:                {crossings[('actors', 'launch')]}")
    print("  all layer crossings:                       " +
          ", ".join(f"{x}->{y} {n}" for (x, y), n in sorted(crossings.items())))
    print("  stops per file (top 5):                    " +
          ", ".join(f"{f} {n}" for f, n in sorted(per_file.items(), key=lambda x: (-x[1], x[0]))[:5]))
    print("  entries per file (top 5, runs of stops):   " +
          ", ".join(f"{f} {n}" for f, n in sorted(entries.items(), key=lambda x: (-x[1], x[0]))[:5]))
    print("  stops per room:                            " +
          ", ".join(f"{r} {n}" for r, n in sorted(collections.Counter(room(f) for f in stops).items(),
                                                   key=lambda x: (-x[1], x[0]))))
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"tree": tree, "stops": [dict(functions[u], depth=d) for u, d, _ in order],
                       "spec_types": sorted(records[u]["name"] for u in S),
                       "moves": moves, "climbs_room": climbs_room, "climbs_layer": climbs_layer,
                       "crossings": {f"{x}->{y}": n for (x, y), n in crossings.items()},
                       "per_file": per_file, "entries": entries}, out, indent=1)


if __name__ == "__main__":
    main()
