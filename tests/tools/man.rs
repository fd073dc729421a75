//! The man pages under `man/` are generated from the clap definitions: one for
//! `seglog` and one per subcommand (`seglog-verify.1`, `seglog-topics-create.1`, …).
//! This test fails when a committed page differs from what the code generates, or
//! when a page exists for a command that no longer does. With `SEGLOG_REGEN_MAN=1` it
//! rewrites the pages instead: `SEGLOG_REGEN_MAN=1 cargo test --test tools man`.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use clap::CommandFactory;

/// Every page: file name → roff bytes.
fn generate() -> BTreeMap<String, Vec<u8>> {
    fn walk(cmd: &clap::Command, out: &mut BTreeMap<String, Vec<u8>>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, out);
        }
        let man = clap_mangen::Man::new(cmd.clone());
        let mut bytes = Vec::new();
        man.render(&mut bytes).unwrap();
        out.insert(man.get_filename(), bytes);
    }
    let mut cmd = seglog::cmd::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut out = BTreeMap::new();
    walk(&cmd, &mut out);
    out
}

fn committed(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir).into_iter().flatten() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".1") {
            out.insert(name, fs::read(e.path()).unwrap());
        }
    }
    out
}

#[test]
fn man_pages_match_the_cli() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("man");
    let fresh = generate();
    assert!(fresh.contains_key("seglog.1"));
    assert!(fresh.contains_key("seglog-verify.1"));
    assert!(fresh.contains_key("seglog-dump.1"));
    assert!(fresh.contains_key("seglog-reindex.1"));
    if std::env::var_os("SEGLOG_REGEN_MAN").is_some_and(|v| v == "1") {
        fs::create_dir_all(&dir).unwrap();
        for name in committed(&dir).keys() {
            if !fresh.contains_key(name) {
                fs::remove_file(dir.join(name)).unwrap();
            }
        }
        for (name, bytes) in &fresh {
            fs::write(dir.join(name), bytes).unwrap();
        }
        return;
    }
    let old = committed(&dir);
    let hint = "regenerate with `SEGLOG_REGEN_MAN=1 cargo test --test tools man` and commit man/";
    let stale: Vec<&String> = old.keys().filter(|n| !fresh.contains_key(*n)).collect();
    assert!(
        stale.is_empty(),
        "pages for commands that no longer exist: {stale:?}; {hint}"
    );
    for (name, bytes) in &fresh {
        let Some(have) = old.get(name) else {
            panic!("man/{name} is missing; {hint}");
        };
        if have != bytes {
            let have = String::from_utf8_lossy(have);
            let want = String::from_utf8_lossy(bytes);
            let line = have
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
            panic!(
                "man/{name} differs from the CLI definition from line {}:\n  committed: {:?}\n  generated: {:?}\n{hint}",
                line + 1,
                have.lines().nth(line).unwrap_or(""),
                want.lines().nth(line).unwrap_or(""),
            );
        }
    }
}

/// clap_mangen renders no alias, so every visible alias of an option (and of a
/// subcommand) must be named by its help text: the generated page of its command
/// says it, as `--help` does.
#[test]
fn man_pages_name_every_visible_alias() {
    fn walk(cmd: &clap::Command, pages: &BTreeMap<String, Vec<u8>>, missing: &mut Vec<String>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, pages, missing);
        }
        let page_name = clap_mangen::Man::new(cmd.clone()).get_filename();
        let page = String::from_utf8_lossy(&pages[&page_name]).replace("\\-", "-");
        let mut names: Vec<String> = Vec::new();
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            names.extend(
                arg.get_visible_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| format!("--{a}")),
            );
            names.extend(
                arg.get_visible_short_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| format!("-{c}")),
            );
        }
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            names.extend(sub.get_visible_aliases().map(str::to_string));
        }
        for name in names {
            if !page.contains(&name) {
                missing.push(format!("{page_name}: {name}"));
            }
        }
    }
    let pages = generate();
    let mut cmd = seglog::cmd::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut missing = Vec::new();
    walk(&cmd, &pages, &mut missing);
    assert!(
        missing.is_empty(),
        "visible aliases no man page names: {missing:?}"
    );
}
