//! Module-graph check: the modules of `continuum-shards`, `continuum-core`, `continuum-control`,
//! the binary (`src/`), the simulator (`sim/`), the bench, the event bus listener
//! (`continuum-bus`), its wire contract (`continuum-event-bus`) and the broker
//! (`continuum-event-broker`) must not depend on each other in a cycle.
//!
//! The rule, checked at every level of each crate's module tree (the crate root `lib.rs` is the
//! parent of the top-level modules): the sibling modules under one parent form an acyclic graph,
//! where sibling `A -> B` when any non-test file in `A`'s subtree refers to a path inside `B`'s
//! subtree. Only the level where the two paths part counts: `proxy/relay.rs` naming
//! `crate::shard::X` is the edge `proxy -> shard` under the crate root. A module naming its own
//! ancestors' items (`super::Item` of the parent's own file) makes no edge.
//!
//! References are read from the source text, without comments, string and char literals: paths
//! starting with `crate::`, `$crate::`, `self::` or `super::` (any number of `super`) anywhere in
//! code, and `use` trees, grouped ones too (`use crate::{a, b::c}`), and `use child::X` of a
//! child module. A name brought in by a `use` is followed to where it comes from, so with
//! `pub use shard::X;` in `lib.rs`, `crate::X` also counts as a reference into `shard`: a
//! re-export does not hide a dependency.
//!
//! Test code is no source of edges (tests may reach anywhere): modules declared under
//! `#[cfg(test)]` and every other item under `#[cfg(test)]` (an inline `mod tests { .. }`), files
//! starting with `#![cfg(test)]`, and modules named `tests`, `*_tests`, `tests_*` or
//! `test_support`, with their subtrees. Other inline `mod x { .. }` blocks count as part of their
//! file. `#[cfg(feature = ..)] mod x;` is followed (all features), and so is `#[path = ..]`.
//!
//! Not seen: names used bare after a glob import (`use super::*;`; the glob itself points at the
//! parent, which makes no edge) and paths that macros build.
//!
//! A failure lists every cycle as `shards: conn -> proxy -> shard -> conn`, then one reference
//! (file:line) per edge on a cycle. `checker_finds_a_planted_cycle` tests the checker itself on
//! small trees written to a temporary directory.
#![allow(clippy::disallowed_methods)] // temp-dir names only
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// At most this many cycles are listed per crate.
const MAX_CYCLES: usize = 200;

/// A module path from the crate root (`["proxy", "relay"]`).
type ModPath = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Punct(char),
    /// `::`
    Sep,
}

/// A token and its line.
type Token = (Tok, usize);

/// Splits Rust source into identifiers, string literals and punctuation; comments, char
/// literals, lifetimes and numbers are dropped.
fn lex(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let newlines: Vec<usize> = (0..c.len()).filter(|&k| c[k] == '\n').collect();
    let line = |k: usize| newlines.partition_point(|&n| n < k) + 1;
    let (mut out, mut i) = (Vec::new(), 0);
    while i < c.len() {
        let start = i;
        if c[i..].starts_with(&['/', '/']) {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i..].starts_with(&['/', '*']) {
            let mut depth = 0;
            while i < c.len() {
                if c[i..].starts_with(&['/', '*']) {
                    (depth, i) = (depth + 1, i + 2);
                } else if c[i..].starts_with(&['*', '/']) {
                    (depth, i) = (depth - 1, i + 2);
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c[i] == '\'' {
            i = quote_end(&c, i);
        } else if c[i].is_alphanumeric() || c[i] == '_' || c[i] == '"' {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let hashes = c[i..].iter().take_while(|&&h| h == '#').count();
            let raw = matches!(word.as_str(), "r" | "br" | "cr") && at(i + hashes) == '"';
            if raw || (matches!(word.as_str(), "" | "b" | "c") && at(i) == '"') {
                let open = i + if raw { hashes } else { 0 };
                let close = closing_quote(&c, open, raw.then_some(hashes));
                let text = c[open + 1..close.min(c.len())].iter().collect();
                out.push((Tok::Str(text), line(start)));
                i = close + 1 + if raw { hashes } else { 0 };
            } else if word == "b" && at(i) == '\'' {
                i = quote_end(&c, i);
            } else if word == "r" && hashes == 1 {
                i += 1; // raw identifier `r#name`: the name is lexed next
            } else if !c[start].is_ascii_digit() {
                out.push((Tok::Ident(word), line(start)));
            }
        } else if c[i..].starts_with(&[':', ':']) {
            out.push((Tok::Sep, line(start)));
            i += 2;
        } else {
            if !c[i].is_whitespace() {
                out.push((Tok::Punct(c[i]), line(start)));
            }
            i += 1;
        }
    }
    out
}

/// The index of the `"` closing the string literal opened at `open` (`raw`: its `#` count).
fn closing_quote(c: &[char], open: usize, raw: Option<usize>) -> usize {
    let mut j = open + 1;
    while j < c.len() {
        match raw {
            None if c[j] == '\\' => j += 1,
            None if c[j] == '"' => return j,
            Some(n)
                if c[j] == '"' && c[j + 1..].iter().take(n).filter(|&&h| h == '#').count() == n =>
            {
                return j;
            }
            _ => {}
        }
        j += 1;
    }
    c.len()
}

/// The index after the char literal or lifetime whose `'` is at `i`.
fn quote_end(c: &[char], i: usize) -> usize {
    if c.get(i + 1) == Some(&'\\') {
        (i + 3..c.len())
            .find(|&j| c[j] == '\'')
            .map_or(c.len(), |j| j + 1)
    } else if c.get(i + 2) == Some(&'\'') {
        i + 3
    } else {
        i + 1 // a lifetime or label: its name is lexed as an identifier (and is harmless)
    }
}

fn tok(t: &[Token], i: usize) -> Option<&Tok> {
    t.get(i).map(|x| &x.0)
}

fn ident(t: &[Token], i: usize) -> Option<&str> {
    match tok(t, i) {
        Some(Tok::Ident(w)) => Some(w),
        _ => None,
    }
}

/// The attribute whose `#` is at `i`: (index after it, inner `#!`?, the tokens inside `[..]`).
fn attribute(t: &[Token], i: usize) -> Option<(usize, bool, &[Token])> {
    let inner = tok(t, i + 1) == Some(&Tok::Punct('!'));
    let open = i + 1 + usize::from(inner);
    if tok(t, i) != Some(&Tok::Punct('#')) || tok(t, open) != Some(&Tok::Punct('[')) {
        return None;
    }
    let mut depth = 0;
    for (k, (x, _)) in t.iter().enumerate().skip(open) {
        match x {
            Tok::Punct('[') => depth += 1,
            Tok::Punct(']') if depth == 1 => return Some((k + 1, inner, &t[open + 1..k])),
            Tok::Punct(']') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn is_cfg_test(attr: &[Token]) -> bool {
    let has = |w: &str| attr.iter().any(|x| x.0 == Tok::Ident(w.to_string()));
    ident(attr, 0) == Some("cfg") && has("test") && !has("not")
}

/// The index after the item at `i`: after its attributes, up to its `;` or its `{..}` block.
fn skip_item(t: &[Token], mut i: usize) -> usize {
    while let Some((end, _, _)) = attribute(t, i) {
        i = end;
    }
    let mut depth = 0;
    while let Some(x) = tok(t, i) {
        match x {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') if depth == 0 => return i,
            Tok::Punct('}') if depth == 1 => return i + 1,
            Tok::Punct(')' | ']' | '}') => depth -= 1,
            Tok::Punct(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// One path written in a file.
#[derive(Debug, Clone)]
struct RawRef {
    /// The inline modules around it, inside its file.
    scope: Vec<String>,
    segs: Vec<String>,
    line: usize,
    /// For a `use` leaf other than a glob: the name it brings into scope.
    alias: Option<String>,
}

/// Reads the `use` tree at `*i` under `prefix`, pushing one reference per leaf.
fn use_tree(t: &[Token], i: &mut usize, prefix: &[String], out: &mut Vec<RawRef>) {
    let (mut segs, line) = (prefix.to_vec(), t.get(*i).map_or(0, |x| x.1));
    if tok(t, *i) == Some(&Tok::Sep) {
        segs.push("::".to_string()); // `use ::name`: an external crate
        *i += 1;
    }
    let mut alias = None;
    while let Some(x) = tok(t, *i) {
        match x {
            Tok::Ident(w) if w == "as" => {
                alias = ident(t, *i + 1).map(str::to_string);
                *i += 2;
                break;
            }
            Tok::Ident(w) => {
                segs.push(w.clone());
                *i += 1 + usize::from(tok(t, *i + 1) == Some(&Tok::Sep));
                alias = segs.last().filter(|s| *s != "self").cloned();
            }
            Tok::Punct('{') => {
                *i += 1;
                while tok(t, *i).is_some_and(|x| *x != Tok::Punct('}')) {
                    let before = *i;
                    use_tree(t, i, &segs, out);
                    *i += usize::from(tok(t, *i) == Some(&Tok::Punct(',')) || *i == before);
                }
                *i += 1;
                return;
            }
            Tok::Punct('*') => {
                *i += 1;
                alias = None;
                break;
            }
            _ => break,
        }
    }
    if segs.last().is_some_and(|s| s == "self") {
        segs.pop();
        alias = segs.last().cloned().filter(|_| alias.is_none()).or(alias);
    }
    out.push(RawRef {
        scope: vec![],
        segs,
        line,
        alias,
    });
}

/// What one file declares and names.
#[derive(Debug, Default)]
struct Parsed {
    refs: Vec<RawRef>,
    /// `mod name;`: the inline scope it is in, its name and its `#[path]`.
    decls: Vec<(Vec<String>, String, Option<String>)>,
    inline: Vec<Vec<String>>,
}

/// Reads one file's tokens; `None` for a file of test code only (`#![cfg(test)]`).
fn parse(t: &[Token]) -> Option<Parsed> {
    let mut p = Parsed::default();
    let (mut i, mut depth, mut path_attr) = (0, 0, None);
    let mut inline: Vec<(String, usize)> = Vec::new();
    while let Some(x) = tok(t, i) {
        let scope: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
        let prev_joins =
            i > 0 && (tok(t, i - 1) == Some(&Tok::Sep) || ident(t, i - 1) == Some("in"));
        match x {
            Tok::Punct('#') => match attribute(t, i) {
                Some((_, true, a)) if is_cfg_test(a) && depth == 0 => return None,
                Some((_, false, a)) if is_cfg_test(a) => i = skip_item(t, i),
                Some((end, _, a)) => {
                    if let (Some("path"), Some(Tok::Str(s))) = (ident(a, 0), tok(a, 2)) {
                        path_attr = Some(s.clone());
                    }
                    i = end;
                }
                None => i += 1,
            },
            Tok::Ident(w) if w == "mod" && ident(t, i + 1).is_some() => {
                let name = ident(t, i + 1).unwrap_or_default().to_string();
                if tok(t, i + 2) == Some(&Tok::Punct('{')) {
                    inline.push((name, depth));
                    p.inline
                        .push(inline.iter().map(|(n, _)| n.clone()).collect());
                    depth += 1;
                } else {
                    p.decls.push((scope, name, path_attr.take()));
                }
                i += 3;
            }
            Tok::Ident(w) if w == "use" => {
                let first = p.refs.len();
                i += 1;
                use_tree(t, &mut i, &[], &mut p.refs);
                p.refs[first..]
                    .iter_mut()
                    .for_each(|r| r.scope.clone_from(&scope));
            }
            Tok::Ident(w)
                if matches!(w.as_str(), "crate" | "self" | "super")
                    && tok(t, i + 1) == Some(&Tok::Sep)
                    && !prev_joins =>
            {
                let (mut segs, line) = (vec![w.clone()], t[i].1);
                while let (Some(Tok::Sep), Some(next)) = (tok(t, i + 1), ident(t, i + 2)) {
                    segs.push(next.to_string());
                    i += 2;
                }
                p.refs.push(RawRef {
                    scope,
                    segs,
                    line,
                    alias: None,
                });
                i += 1;
            }
            Tok::Punct('{') => (depth, i) = (depth + 1, i + 1),
            Tok::Punct('}') => {
                (depth, i) = (depth.saturating_sub(1), i + 1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Punct(';') => (path_attr, i) = (None, i + 1),
            _ => i += 1,
        }
    }
    Some(p)
}

/// Test modules are not part of the graph (see the module docs).
fn is_test_name(name: &str) -> bool {
    let affix = name.ends_with("_tests") || name.starts_with("tests_");
    affix || name == "tests" || name == "test_support"
}

/// A crate's module tree and the references of each of its files.
#[derive(Debug, Default)]
struct CrateGraph {
    /// File modules.
    modules: BTreeSet<ModPath>,
    /// File modules and inline modules.
    scopes: BTreeSet<ModPath>,
    /// (file module, file, reference), in file and line order.
    refs: Vec<(ModPath, PathBuf, RawRef)>,
}

fn load(root_file: &Path) -> Result<CrateGraph, String> {
    let mut g = CrateGraph::default();
    let mut queue = vec![(ModPath::new(), root_file.to_path_buf())];
    while let Some((module, file)) = queue.pop() {
        let src = std::fs::read_to_string(&file)
            .map_err(|e| format!("module {module:?}: reading {}: {e}", file.display()))?;
        g.modules.insert(module.clone());
        g.scopes.insert(module.clone());
        let Some(parsed) = parse(&lex(&src)) else {
            continue;
        };
        let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let mod_rs = file == root_file || file.ends_with("mod.rs");
        let base = match file.file_stem() {
            Some(stem) if !mod_rs => dir.join(stem),
            _ => dir.clone(),
        };
        for (scope, name, path_attr) in parsed.decls {
            let d = base.join(scope.join("/"));
            let child = match path_attr {
                _ if is_test_name(&name) => continue,
                Some(p) if scope.is_empty() => dir.join(p),
                Some(p) => d.join(p),
                None if d.join(format!("{name}.rs")).exists() => d.join(format!("{name}.rs")),
                None => d.join(&name).join("mod.rs"),
            };
            queue.push(([&module[..], &scope[..], &[name]].concat(), child));
        }
        for s in parsed.inline {
            g.scopes.insert([&module[..], &s[..]].concat());
        }
        for r in parsed.refs {
            g.refs.push((module.clone(), file.clone(), r));
        }
    }
    g.refs.sort_by_key(|(_, file, r)| (file.clone(), r.line));
    Ok(g)
}

/// The longest prefix of `path` in `set`.
fn owner(set: &BTreeSet<ModPath>, path: &[String]) -> ModPath {
    let mut found = set.iter().filter(|m| path.starts_with(m));
    found.next_back().cloned().unwrap_or_default()
}

/// A sibling edge: (parent, from, to), with full module paths joined by `::`.
type Edge = (ModPath, String, String);

impl CrateGraph {
    /// Where `segs`, written in module `scope`, points from the crate root; `None` if outside.
    fn absolute(&self, scope: &[String], segs: &[String]) -> Option<ModPath> {
        let (mut cur, first) = (scope.to_vec(), segs.first()?);
        let mut k = usize::from(first == "crate" || first == "self");
        if first == "crate" {
            cur.clear();
        } else if !matches!(first.as_str(), "self" | "super")
            && !self.scopes.contains(&[scope, &segs[..1]].concat())
        {
            return None; // an external crate (or a name this check does not follow)
        }
        while segs.get(k).is_some_and(|s| s == "super") {
            cur.pop()?;
            k += 1;
        }
        Some([&cur[..], &segs[k..]].concat())
    }

    /// Every sibling edge, with the `file:line path` of one reference (direct ones preferred).
    fn edges(&self, display_root: &Path) -> BTreeMap<Edge, String> {
        let mut imports: BTreeMap<(ModPath, String), ModPath> = BTreeMap::new();
        let mut resolved = Vec::new();
        for (module, file, r) in &self.refs {
            let scope = [&module[..], &r.scope[..]].concat();
            let Some(abs) = self.absolute(&scope, &r.segs) else {
                continue;
            };
            if let Some(alias) = &r.alias {
                imports.insert((scope, alias.clone()), abs.clone());
            }
            resolved.push((module, file, r, abs));
        }
        let mut edges = BTreeMap::new();
        for (src, file, r, mut path) in resolved {
            let shown = file.strip_prefix(display_root).unwrap_or(file).display();
            let at = format!("{shown}:{}", r.line);
            let mut via = String::new();
            for _ in 0..8 {
                let target = owner(&self.modules, &path);
                let common = src.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common < src.len() && common < target.len() {
                    let ends = (src[..=common].join("::"), target[..=common].join("::"));
                    let text = format!("{at} `{}`{via}", r.segs.join("::"));
                    let old = edges.entry((src[..common].to_vec(), ends.0, ends.1));
                    let old = old.or_insert_with(|| text.clone());
                    if via.is_empty() && old.contains(" (via ") {
                        *old = text;
                    }
                }
                // Follow a name that `path`'s module imports to where it comes from.
                let scope = owner(&self.scopes, &path);
                let Some(name) = path.get(scope.len()) else {
                    break;
                };
                let Some(real) = imports.get(&(scope.clone(), name.clone())) else {
                    break;
                };
                let real = [&real[..], &path[scope.len() + 1..]].concat();
                if real == path {
                    break;
                }
                via = format!(" (via re-export of `crate::{}`)", real.join("::"));
                path = real;
            }
        }
        edges
    }
}

/// The cycles of sibling modules in a crate (each starting at its least module), and one
/// reference per edge on them.
#[derive(Debug, Default)]
struct Report {
    /// At most `MAX_CYCLES` of them (the search stops there).
    cycles: Vec<Vec<String>>,
    evidence: BTreeMap<(String, String), String>,
}

fn check(lib_rs: &Path, display_root: &Path) -> Result<Report, String> {
    let canon = |p: &Path| {
        p.canonicalize()
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    let edges = load(&canon(lib_rs)?)?.edges(&canon(display_root)?);
    let mut levels: BTreeMap<&ModPath, BTreeMap<&String, Vec<&String>>> = BTreeMap::new();
    for (parent, from, to) in edges.keys() {
        levels
            .entry(parent)
            .or_default()
            .entry(from)
            .or_default()
            .push(to);
    }
    let mut report = Report::default();
    for graph in levels.values() {
        // Every elementary cycle whose least module is `start`, by depth-first search.
        for &start in graph.keys() {
            let (mut stack, mut path) = (vec![graph[start].clone()], vec![start]);
            while let (Some(next), true) = (stack.last_mut(), report.cycles.len() < MAX_CYCLES) {
                let Some(n) = next.pop() else {
                    stack.pop();
                    path.pop();
                    continue;
                };
                if n == start {
                    report
                        .cycles
                        .push(path.iter().map(|s| s.to_string()).collect());
                } else if n > start && !path.contains(&n) {
                    stack.push(graph.get(n).cloned().unwrap_or_default());
                    path.push(n);
                }
            }
        }
    }
    report.cycles.sort();
    for cycle in &report.cycles {
        for (k, from) in cycle.iter().enumerate() {
            let to = &cycle[(k + 1) % cycle.len()];
            let mut parent: ModPath = from.split("::").map(str::to_string).collect();
            parent.pop();
            let at = edges[&(parent, from.clone(), to.clone())].clone();
            report.evidence.insert((from.clone(), to.clone()), at);
        }
    }
    Ok(report)
}

fn render(krate: &str, report: &Report) -> String {
    let mut out = format!("{} module cycle(s) in {krate}:\n", report.cycles.len());
    if report.cycles.len() >= MAX_CYCLES {
        out += "(the search stopped there; there are more)\n";
    }
    for cycle in &report.cycles {
        out += &format!("  {krate}: {} -> {}\n", cycle.join(" -> "), cycle[0]);
    }
    out += "edges on these cycles (one reference each):\n";
    for ((from, to), at) in &report.evidence {
        out += &format!("  {from} -> {to}: {at}\n");
    }
    out
}

fn assert_acyclic(krate: &str, lib_rs: &str) {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir.parent().unwrap_or(manifest_dir);
    let report = check(&manifest_dir.join(lib_rs), workspace).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.cycles.is_empty(), "{}", render(krate, &report));
}

#[test]
fn shards_has_no_module_cycles() {
    assert_acyclic("shards", "src/lib.rs");
}

#[test]
fn core_has_no_module_cycles() {
    assert_acyclic("core", "../core/src/lib.rs");
}

#[test]
fn bench_has_no_module_cycles() {
    assert_acyclic("bench", "../bench/src/main.rs");
}

#[test]
fn the_binary_and_the_simulator_have_no_module_cycles() {
    assert_acyclic("continuum-router", "../src/main.rs");
    assert_acyclic("sim", "../sim/src/lib.rs");
}

#[test]
fn control_has_no_module_cycles() {
    assert_acyclic("control", "../control/src/lib.rs");
}

#[test]
fn event_bus_crates_have_no_module_cycles() {
    assert_acyclic("bus", "../bus/src/lib.rs");
    assert_acyclic(
        "continuum-event-bus",
        "../crates/continuum-event-bus/src/lib.rs",
    );
    assert_acyclic(
        "continuum-event-broker",
        "../crates/continuum-event-broker/src/lib.rs",
    );
}

/// Writes the files of `tree` (each starting with a `@@ path` line) under `root/krate`, and
/// checks that crate.
fn planted(root: &Path, krate: &str, tree: &str) -> Report {
    for file in tree.split("@@ ").skip(1) {
        let (name, text) = file.split_once('\n').unwrap();
        let path = root.join(krate).join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    check(&root.join(krate).join("lib.rs"), root).unwrap()
}

/// A directory removed when dropped, also when an assertion fails.
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

#[test]
fn checker_finds_a_planted_cycle() {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let unique = format!("{}_{}", std::process::id(), nanos.unwrap().as_nanos());
    let dir = TempDir(std::env::temp_dir().join(format!("module_graph_{unique}")));
    let root = &dir.0;
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    // a -> b -> c -> a; d is used by a and b; e has an acyclic level of its own.
    let cyclic = r#"@@ lib.rs
mod a;
#[cfg(feature = "x")]
mod b;
mod c;
mod d;
pub mod e;
@@ a.rs
use crate::{d::D, b::B};
@@ b.rs
fn f() { crate::c::g(); let _ = super::d::D; }
@@ c.rs
pub fn g() { let _ = super::not_a_module::x; }
use super::a;
@@ d.rs
pub struct D;
@@ e/mod.rs
mod x;
mod y {
    use super::x::X;
}
pub struct E;
@@ e/x.rs
pub struct X;
fn f() { let _ = super::E; let _ = self::X; }
"#;
    let report = planted(root, "cyclic", cyclic);
    assert_eq!(report.cycles, vec![strings(&["a", "b", "c"])]);
    let evidence: Vec<_> = report.evidence.values().cloned().collect();
    let expected = ["cyclic/a.rs:1 `crate::b::B`", "cyclic/b.rs:1 `crate::c::g`"];
    assert_eq!(
        evidence,
        strings(&[expected[0], expected[1], "cyclic/c.rs:2 `super::a`"])
    );
    let text = render("cyclic", &report);
    assert!(text.contains("\n  cyclic: a -> b -> c -> a\n"), "{text}");

    // Acyclic: a nested level, references to ancestors' items and up two levels.
    let acyclic = r#"@@ lib.rs
mod a;
mod b;
pub struct Root;
@@ a/mod.rs
mod x;
mod y;
pub use x::X;
pub struct Item;
@@ a/x.rs
pub struct X;
fn f() { super::y::g(); super::super::b::h(); }
@@ a/y.rs
pub fn g() { let _ = crate::Root; let _ = super::super::b::B; let _ = super::Item; }
@@ b.rs
pub struct B;
pub fn h() {}
"#;
    let report = planted(root, "acyclic", acyclic);
    assert!(report.cycles.is_empty(), "{}", render("acyclic", &report));

    // b -> a appears only in comments, strings, char literals and test code: no cycle.
    let hidden = r##"@@ lib.rs
mod a;
mod b;
@@ a.rs
use crate::b::B;
@@ b.rs
//! crate::a::A
/// use crate::a::A;
pub struct B;
/* use crate::a /* nested */ crate::a::A */
fn f() -> (&'static str, char, &'static [u8]) {
    let _s = "crate::a::A \" crate::a";
    let _r = r#"use crate::a::A;"#;
    ("super::a::A", '"', b"crate::a") // crate::a
}
#[cfg(test)]
mod inline { use crate::a::A; }
#[cfg(test)]
mod tests;
mod more_tests;
@@ b/tests.rs
use crate::a::A;
@@ b/more_tests.rs
use crate::a::A;
"##;
    let report = planted(root, "hidden", hidden);
    assert!(report.cycles.is_empty(), "{}", render("hidden", &report));

    // p -> q directly; q -> p only through the re-export in lib.rs.
    let reexport = "@@ lib.rs\nmod p;\nmod q;\npub use p::P;\n\
                    @@ p.rs\nfn f() { let _ = crate::q::Q; }\n@@ q.rs\nuse crate::P;\n";
    let report = planted(root, "reexport", reexport);
    assert_eq!(report.cycles, vec![strings(&["p", "q"])]);
    let via = &report.evidence[&("q".to_string(), "p".to_string())];
    assert_eq!(
        via,
        "reexport/q.rs:1 `crate::P` (via re-export of `crate::p::P`)"
    );
}
