#!/usr/bin/env python3
"""The layering and purity rules of the source tree, checked (`make lint` runs this).

Every top-level folder with code has a README.md that declares, on lines of their own:

  Depends on: common, protocol        (folders it may include and link; `nothing` for none)
  Purity: core                        (`core`, `sim` or `none`; optionally `core: FILE-GLOB ...` for some files)

Checks:
  1. layers: every `#include "F/..."` and every link of a bftfs_* library (target_link_libraries in the
     CMakeLists.txt files) goes from a folder to itself or to a folder it declares; Python imports between the
     Python folders likewise (`import harness`, `from benchmarks import ...`);
  2. cycles: the folder graph of what the code actually includes and links has no cycle (each one found is
     printed as a path), and neither has the declared graph;
  3. purity: every file declared pure follows the rules of its level, and includes only project headers
     declared pure at the same level or stricter (so a pure layer cannot reach impure code through a header):
       core  no libevent, sockets, threads, clocks, ambient randomness, sleeping, or file I/O
             (time is ticks, randomness an injected Prng, storage an injected interface);
       sim   the same except file I/O (the simulator owns a run's files and output).
     A line that must break a purity rule says why on the same line: `// lint: allow-impure <reason>`.

  python3 scripts/check_layers.py [--graph]
"""
import fnmatch
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_EXT = (".h", ".hh", ".hpp", ".cc", ".cpp", ".c")
SKIP_DIRS = {".git", "__pycache__", "docs", "bench-results", ".ci"}
LEVELS = {"none": 0, "sim": 1, "core": 2}

RULES_SIM = [
    (r'#\s*include\s*[<"](event2/[^>"]*|event\.h)[>"]', "libevent belongs to runtime/"),
    (r'#\s*include\s*[<"](sys/socket\.h|netinet/[^>"]*|arpa/inet\.h|netdb\.h|sys/un\.h|linux/(netlink|if_packet)\.h)[>"]',
     "sockets belong to runtime/"),
    (r'#\s*include\s*<(thread|mutex|shared_mutex|condition_variable|future|semaphore|latch|barrier|stop_token|pthread\.h)>',
     "threads: a pure core is single-threaded and driven by its caller"),
    (r'#\s*include\s*<(chrono|ctime|time\.h|sys/time\.h)>', "clocks: time in a pure core is ticks"),
    (r'#\s*include\s*<(random)>', "randomness comes from the injected Prng (common/prng.h)"),
    (r'\bstd::(chrono|this_thread|thread|jthread|mutex|async|random_device|mt19937(_64)?|default_random_engine)\b',
     "threads, clocks and ambient randomness are not allowed here"),
    (r'(?<![\w.>:])(rand|srand|random|srandom|drand48|clock_gettime|gettimeofday|getrandom|arc4random|sleep|usleep|nanosleep)\s*\(',
     "ambient time, sleep or randomness"),
    (r'(?<![\w.>:])(std::)?time\s*\(\s*(nullptr|NULL|0|&)', "wall-clock time: time in a pure core is ticks"),
    (r'\brandombytes_\w+\s*\(', "libsodium randomness: a pure core takes keys and seeds from its caller"),
]
RULES_CORE = RULES_SIM + [
    (r'#\s*include\s*<(fstream|filesystem|fcntl\.h|unistd\.h|sys/stat\.h|dirent\.h)>',
     "file I/O: a pure core reaches storage only through injected interfaces"),
    (r'(?<![\w.>:])(fopen|open|openat|fsync|fdatasync|opendir)\s*\(', "file I/O in a pure core"),
]
ALLOW = re.compile(r'//\s*lint:\s*allow-impure\s+\S')
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
PY_IMPORT = re.compile(r'^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))')
PY_PATH = re.compile(r'sys\.path\.(?:insert|append)\(')
PY_QUOTED = re.compile(r'["\']([\w-]+)["\']')


class Layer:
    def __init__(self, name):
        self.name = name
        self.deps = None        # declared folders (set), None if not declared
        self.purity = {}        # glob (relative to the folder) -> level; "*" for the whole folder
        self.problems = []


def read_layers():
    layers = {}
    for name in sorted(os.listdir(ROOT)):
        path = os.path.join(ROOT, name)
        if not os.path.isdir(path) or name in SKIP_DIRS or name.startswith((".", "build")):
            continue
        if not any(f.endswith(CODE_EXT + (".py",)) for _, _, fs in os.walk(path) for f in fs):
            continue
        layer = Layer(name)
        layers[name] = layer
        readme = os.path.join(path, "README.md")
        if not os.path.isfile(readme):
            layer.problems.append(f"{name}/README.md is missing (it must declare `Depends on:` and `Purity:`)")
            continue
        for line in open(readme, encoding="utf-8"):
            m = re.match(r'^Depends on:\s*(.*?)\s*\.?$', line.strip())
            if m:
                words = [w.strip() for w in m.group(1).split(",") if w.strip()]
                layer.deps = set() if words == ["nothing"] else set(words)
            m = re.match(r'^Purity:\s*(core|sim|none)\s*(?::\s*(.*))?$', line.strip())
            if m:
                globs = m.group(2).split() if m.group(2) else ["*"]
                for g in globs:
                    layer.purity[g] = LEVELS[m.group(1)]
        if layer.deps is None:
            layer.problems.append(f"{name}/README.md has no `Depends on:` line")
        if not layer.purity:
            layer.problems.append(f"{name}/README.md has no `Purity:` line")
    for layer in layers.values():
        for d in sorted(layer.deps or ()):
            if d not in layers:
                layer.problems.append(f"{layer.name}/README.md: `Depends on:` names {d}, which is not a code folder")
    return layers


def purity_of(layers, relpath):
    top, _, rest = relpath.partition("/")
    layer = layers.get(top)
    if layer is None:
        return 0
    level = 0
    for g, lv in layer.purity.items():
        if g == "*" or fnmatch.fnmatch(rest, g) or fnmatch.fnmatch(os.path.basename(rest), g):
            level = max(level, lv)
    return level


def strip(line, state):
    """Removes comments and string/char literals; `state` carries an open /* comment across lines."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["block"], i = False, j + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"], i = True, i + 2
            continue
        if c in "\"'" and not (c == "'" and i > 0 and line[i - 1].isalnum()):  # skip 1'000 digit separators
            if c == '"' and line.lstrip().startswith("#") and "include" in line:
                out.append(line[i:])  # keep #include "x.h" intact
                break
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def source_files(layers):
    for name in layers:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, name)):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            for f in sorted(files):
                if f.endswith(CODE_EXT + (".py",)):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def scan(layers):
    """Returns (edges, problems): edges {(from, to): example}, from includes, imports and links."""
    edges, problems, checked = {}, [], 0
    # Python folders only (`import os` is the standard library, not os/).
    py_modules = {name for name in layers if any(f.endswith(".py") for _, _, fs in os.walk(os.path.join(ROOT, name))
                                                 for f in fs)}
    for rel in source_files(layers):
        top = rel.split("/", 1)[0]
        level = purity_of(layers, rel)
        rules = RULES_CORE if level == LEVELS["core"] else RULES_SIM if level == LEVELS["sim"] else []
        state = {"block": False}
        checked += level > 0
        for lineno, raw in enumerate(open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace"), 1):
            if rel.endswith(".py"):
                m = PY_IMPORT.match(raw)
                mod = (m.group(1) or m.group(2)).split(".")[0] if m else None
                if PY_PATH.search(raw):  # a folder put on sys.path is a dependency on that folder
                    mod = next((w for w in PY_QUOTED.findall(raw) if w in py_modules), mod)
                if mod in py_modules and mod != top:
                    edges.setdefault((top, mod), f"{rel}:{lineno}")
                continue
            code = strip(raw.rstrip("\n"), state)
            m = INCLUDE.match(code)
            if m:
                target = m.group(1)
                ttop = target.split("/", 1)[0]
                if ttop in layers and ttop != top:
                    edges.setdefault((top, ttop), f"{rel}:{lineno}")
                if level > 0 and "/" in target and ttop in layers and purity_of(layers, target) < level:
                    problems.append(f"purity: {rel}:{lineno} includes {target}, which is not declared pure "
                                    f"at this file's level")
            for pattern, why in rules:
                if re.search(pattern, code):
                    if not ALLOW.search(raw):
                        problems.append(f"purity: {rel}:{lineno}: {why}\n      {raw.strip()}")
                    break
    return edges, problems, checked


def link_edges(layers):
    """(from folder, to folder) -> example, from add_library/add_executable and target_link_libraries."""
    owner, links = {}, []
    for dirpath, dirnames, files in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith((".", "build"))]
        if "CMakeLists.txt" not in files:
            continue
        rel = os.path.relpath(dirpath, ROOT)
        top = rel.split("/", 1)[0]
        text = open(os.path.join(dirpath, "CMakeLists.txt"), encoding="utf-8").read()
        text = re.sub(r'#[^\n]*', '', text)
        for m in re.finditer(r'add_(?:library|executable)\(\s*([\w-]+)', text):
            owner[m.group(1)] = top
        for m in re.finditer(r'target_link_libraries\(\s*([\w-]+)([^)]*)\)', text):
            for dep in m.group(2).split():
                if dep.startswith("bftfs_") or dep == "bftfs":
                    links.append((m.group(1), dep, f"{rel}/CMakeLists.txt"))
    edges = {}
    for src, dep, where in links:
        a, b = owner.get(src), owner.get(dep)
        if a and b and a != b and a in layers:
            edges.setdefault((a, b), f"{where}: {src} links {dep}")
    return edges


def cycles(nodes, edge_set):
    """Every elementary cycle found by a depth-first search, as lists of nodes (one per back edge)."""
    graph = {n: sorted(b for a, b in edge_set if a == n) for n in nodes}
    found, color, stack = [], {n: 0 for n in nodes}, []

    def visit(n):
        color[n] = 1
        stack.append(n)
        for m in graph.get(n, ()):
            if color.get(m, 0) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif color.get(m, 0) == 0:
                visit(m)
        stack.pop()
        color[n] = 2

    for n in sorted(nodes):
        if color[n] == 0:
            visit(n)
    return found


def main():
    layers = read_layers()
    problems = [p for layer in layers.values() for p in layer.problems]
    edges, purity_problems, pure_files = scan(layers)
    problems += purity_problems
    for (a, b), where in link_edges(layers).items():
        edges.setdefault((a, b), where)
    for (a, b), where in sorted(edges.items()):
        deps = layers[a].deps
        if deps is not None and b not in deps:
            problems.append(f"layers: {a} -> {b} is not declared in {a}/README.md (`Depends on:`): {where}")
    for cyc in cycles(layers, set(edges)):
        hops = "; ".join(f"{x} -> {y} ({edges[(x, y)]})" for x, y in zip(cyc, cyc[1:]))
        problems.append(f"cycle between folders: {' -> '.join(cyc)}: {hops}")
    declared = {(a, b) for a, layer in layers.items() for b in (layer.deps or ()) if b in layers}
    for cyc in cycles(layers, declared):
        problems.append(f"cycle in the declared layers: {' -> '.join(cyc)}")
    if "--graph" in sys.argv:
        for a in sorted(layers):
            print(f"  {a} -> {', '.join(sorted(b for x, b in edges if x == a)) or 'nothing'}")
    for p in problems:
        print(f"  {p}")
    print(f"  {len(layers)} folders, {len(edges)} dependencies between them, {pure_files} pure files checked, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
