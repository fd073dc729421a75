//! The tools for CI fixtures and shells: `completions`, `verify --expect`,
//! `dump --canonical` and `damage`, on the real binary and copies of the committed
//! fixtures.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use seglog::engine::storage::lock::DirLock;

use crate::util::bin::{json, run, run_in, Run};
use crate::util::fs::{copy_tree, files, fixture};
use crate::util::serve::Serve;

const P0: &str = "topics/events/0";
/// Sealed, offsets 0-29, 4549 bytes.
const SEALED: &str = "topics/events/0/00000000000000000000.log";
/// Sealed, offsets 30-59, 4565 bytes.
const SEALED_30: &str = "topics/events/0/00000000000000000030.log";
/// Active, offsets 60-69, 1559 bytes.
const ACTIVE: &str = "topics/events/0/00000000000000000060.log";

fn copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join(name);
    copy_tree(&fixture(name), &data);
    (tmp, data)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every file below `dir` but `LOCK` (tools that modify create it).
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut t = files(dir);
    t.remove("LOCK");
    t
}

/// The paths whose bytes differ between two trees (or that only one has).
fn changed(a: &BTreeMap<String, Vec<u8>>, b: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let mut out: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(b.keys().filter(|k| !a.contains_key(*k)).cloned());
    out
}

fn damage(data: &Path, args: &[&str]) -> Run {
    let mut all = vec!["damage", s(data)];
    all.extend_from_slice(args);
    run_in(data, &all)
}

/// The visible subcommands of the CLI definition.
fn subcommands() -> Vec<String> {
    seglog::cmd::Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect()
}

fn have(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn completions_generate_for_each_shell_and_name_the_subcommands() {
    let tmp = tempfile::tempdir().unwrap();
    let subs = subcommands();
    assert!(subs.iter().any(|c| c == "damage"), "{subs:?}");
    assert!(subs.iter().any(|c| c == "completions"), "{subs:?}");
    for (shell, checker) in [
        ("bash", Some(("bash", "-n"))),
        ("zsh", Some(("zsh", "-n"))),
        ("fish", Some(("fish", "--no-execute"))),
    ] {
        let r = run(&["completions", shell], tmp.path());
        assert_eq!(r.0, 0, "{shell}: {}", r.2);
        assert_eq!(r.2, "", "{shell}");
        for sub in &subs {
            assert!(r.1.contains(sub.as_str()), "{shell} script lacks {sub}");
        }
        // Flags of nested commands are in it too (fish names them `-l NAME`).
        for flag in ["expect", "flip-bit", "canonical", "drop-index"] {
            let spelled = if shell == "fish" {
                format!("-l {flag}")
            } else {
                format!("--{flag}")
            };
            assert!(r.1.contains(&spelled), "{shell} script lacks {spelled}");
        }
        let script = tmp.path().join(format!("seglog.{shell}"));
        fs::write(&script, &r.1).unwrap();
        let Some((tool, flag)) = checker else {
            continue;
        };
        // bash is always there; the others are checked where installed.
        if tool != "bash" && !have(tool) {
            continue;
        }
        let out = std::process::Command::new(tool)
            .arg(flag)
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{tool} {flag} refused the {shell} script: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The bash script registers itself for `seglog` and completes for real.
    let bash = fs::read_to_string(tmp.path().join("seglog.bash")).unwrap();
    assert!(bash.contains("complete -F _seglog"), "{bash}");
    for (words, want) in [("seglog da", "damage"), ("seglog verify --exp", "--expect")] {
        let w: Vec<&str> = words.split(' ').collect();
        let (cur, prev) = (w[w.len() - 1], w[w.len() - 2]);
        // bash calls a completion function with the command, the word and the one before.
        let script = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD={}; _seglog seglog {cur} {prev}; echo \"${{COMPREPLY[*]}}\"",
            s(&tmp.path().join("seglog.bash")),
            w.len() - 1
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &script])
            .output()
            .unwrap();
        let got = String::from_utf8_lossy(&out.stdout);
        assert_eq!(got.trim(), want, "completing {words:?}: {got:?}");
    }
    let r = run(&["completions", "powershell7"], tmp.path());
    assert_eq!(r.0, 64, "{}", r.2);
    assert_eq!(r.2.lines().count(), 1, "{}", r.2);
}

#[test]
fn verify_expect_each_combination() {
    let cases = [
        ("clean", "clean", 0),
        ("missing-index", "repairable", 1),
        ("bit-flip-sealed", "corrupt", 2),
    ];
    for (name, found, plain_code) in cases {
        let data = fixture(name);
        let plain = run(&["verify", s(&data)], &data);
        assert_eq!(plain.0, plain_code, "{name}");
        let plain_json = run(&["verify", "--json", s(&data)], &data);
        for expect in ["clean", "repairable", "corrupt"] {
            for json_flag in [false, true] {
                let mut args = vec!["verify", s(&data), "--expect", expect];
                if json_flag {
                    args.push("--json");
                }
                let r = run(&args, &data);
                let want_out = if json_flag { &plain_json.1 } else { &plain.1 };
                assert_eq!(&r.1, want_out, "{name} --expect {expect}: stdout changed");
                if expect == found {
                    assert_eq!(r.0, 0, "{name} --expect {expect}: {}", r.2);
                    assert_eq!(r.2, "", "{name} --expect {expect}");
                } else {
                    assert_eq!(r.0, 1, "{name} --expect {expect}");
                    assert_eq!(
                        r.2,
                        format!(
                            "seglog: expected {expect}, found {found} (verify without --expect exits {plain_code})\n"
                        ),
                        "{name} --expect {expect}"
                    );
                }
            }
        }
    }
    let data = fixture("clean");
    let r = run(&["verify", s(&data), "--expect", "fine"], &data);
    assert_eq!(r.0, 64, "{}", r.2);
    // A usage error keeps its code under --expect.
    let r = run(
        &["verify", "/nonexistent/seglog", "--expect", "clean"],
        &data,
    );
    assert_eq!(r.0, 64, "{}", r.2);
}

/// `dump --canonical` of `dir`, run from `cwd` with `path` as given.
fn canonical(path: &str, cwd: &Path) -> (i32, String) {
    let r = run(&["dump", "--canonical", path], cwd);
    assert_eq!(r.2, "", "canonical dump writes nothing to stderr");
    (r.0, r.1)
}

#[test]
fn dump_canonical_is_byte_identical_wherever_the_directory_is() {
    for (name, code) in [("clean", 0), ("bit-flip-sealed", 2), ("torn-tail", 1)] {
        let (tmp_a, a) = copy(name);
        let tmp_b = tempfile::tempdir().unwrap();
        let b = tmp_b
            .path()
            .join("deeper/elsewhere")
            .join(format!("{name}-copy"));
        copy_tree(&fixture(name), &b);
        let (ca, out_a) = canonical(s(&a), tmp_a.path());
        let (cb, out_b) = canonical(s(&b), tmp_b.path());
        // The same directory through a relative path, from inside it.
        let (cc, out_c) = canonical(".", &b);
        assert_eq!((ca, cb, cc), (code, code, code), "{name}");
        crate::util::bin::assert_text(name, &out_b, &out_a);
        crate::util::bin::assert_text(name, &out_c, &out_a);
        for text in [&out_a, &out_b] {
            assert!(!text.contains(s(tmp_a.path())), "{name}: a path of the run");
            assert!(!text.contains(s(tmp_b.path())), "{name}: a path of the run");
        }
        check_canonical_lines(name, &out_a);
        // A partition directory inside the data directory: its lines are the same.
        let (_, part_a) = canonical(s(&a.join(P0)), tmp_a.path());
        let (_, part_b) = canonical(s(&b.join(P0)), tmp_b.path());
        assert_eq!(part_a, part_b, "{name}: partition");
    }
}

/// Every line one compact object, `type` first and the other keys in name order, and
/// the last line the `end` summary.
fn check_canonical_lines(name: &str, text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let types: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let map = v.as_object().unwrap();
            // The one encoding: `type`, then the other keys in name order (nested
            // objects sorted too), compact.
            let mut want = format!("{{\"type\":{}", map["type"]);
            for (k, val) in map.iter().filter(|(k, _)| *k != "type") {
                let _ = write!(want, ",{}:{val}", serde_json::Value::from(k.as_str()));
            }
            want.push('}');
            assert_eq!(*l, want, "{name}: not in canonical form");
            v["type"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(types.last().map(String::as_str), Some("end"), "{name}");
    assert!(types.iter().any(|t| t == "header"), "{name}");
    assert!(types.iter().any(|t| t == "index"), "{name}");
    let records = types.iter().filter(|t| *t == "record").count();
    let end: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(end["records"], records, "{name}");
}

#[test]
fn dump_canonical_matches_the_golden_file() {
    let golden = fixture("bit-flip-sealed.canonical.jsonl");
    let data = fixture("bit-flip-sealed");
    let (code, out) = canonical(".", &data);
    assert_eq!(code, 2);
    if std::env::var_os("SEGLOG_WRITE_GOLDEN").is_some_and(|v| v == "1") {
        fs::write(&golden, &out).unwrap();
        return;
    }
    let want = fs::read_to_string(&golden).unwrap();
    crate::util::bin::assert_text("dump --canonical of bit-flip-sealed", &out, &want);
    let problems: Vec<serde_json::Value> = crate::util::bin::json_lines(&want)
        .into_iter()
        .filter(|v| v["type"] == "problem")
        .collect();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0]["kind"], "crc_mismatch");
    assert_eq!(problems[0]["position"], 1489);
}

/// A damage run that succeeded: its JSON report.
fn damaged(data: &Path, args: &[&str]) -> serde_json::Value {
    let r = damage(data, args);
    r.code(0);
    assert_eq!(r.stderr, "");
    json(&r.stdout)
}

/// `verify --expect want` exits 0 (and the plain verify gives `want`).
fn expect(data: &Path, want: &str) {
    let r = run_in(data, &["verify", s(data), "--expect", want]);
    assert_eq!(
        r.code, 0,
        "verify --expect {want}: {}\n{}",
        r.stderr, r.stdout
    );
    let v = json(&run_in(data, &["verify", "--json", s(data)]).stdout);
    assert_eq!(v["severity"], want);
}

fn problem_kinds(data: &Path) -> Vec<String> {
    let v = json(&run_in(data, &["verify", "--json", s(data)]).stdout);
    let mut kinds: Vec<String> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .chain(
            v["segments"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|s| s["problems"].as_array().unwrap().iter()),
        )
        .map(|p| p["kind"].as_str().unwrap().to_string())
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

#[test]
fn flip_bit_in_a_sealed_record_is_corrupt_and_changes_one_bit() {
    let (_tmp, data) = copy("clean");
    let before = tree(&data);
    let v = damaged(&data, &["--flip-bit", &format!("{SEALED}:1560:3")]);
    assert_eq!(v["action"], "flip_bit");
    assert_eq!(v["file"], SEALED);
    assert_eq!(v["range"], serde_json::json!({"from": 1560, "to": 1561}));
    assert_eq!(v["bit"], 3);
    assert_eq!(
        (
            v["file_bytes_before"].clone(),
            v["file_bytes_after"].clone()
        ),
        (4549.into(), 4549.into())
    );
    let after = tree(&data);
    assert_eq!(changed(&before, &after), vec![SEALED.to_string()]);
    let (old, new) = (&before[SEALED], &after[SEALED]);
    let diffs: Vec<usize> = (0..old.len()).filter(|&i| old[i] != new[i]).collect();
    assert_eq!(diffs, vec![1560]);
    assert_eq!(old[1560] ^ new[1560], 1 << 3);
    assert_eq!(v["bytes_before"], format!("{:02x}", old[1560]));
    assert_eq!(v["bytes_after"], format!("{:02x}", new[1560]));
    expect(&data, "corrupt");
    assert_eq!(problem_kinds(&data), vec!["crc_mismatch"]);
    // The same flip again restores the bytes.
    damaged(&data, &["--flip-bit", &format!("{SEALED}:1560:3")]);
    assert_eq!(tree(&data), before);
    expect(&data, "clean");
}

/// (position, offset) of every record of a whole segment file.
fn record_positions(bytes: &[u8]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = 32usize;
    while pos + 12 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let offset = u64::from_be_bytes(bytes[pos + 4..pos + 12].try_into().unwrap());
        out.push((pos as u64, offset));
        pos += 4 + len;
    }
    out
}

/// The damage problems of `verify --json` on `path`, as (first unreadable offset and
/// position, next readable offset and position), and the records it counted.
fn unreadable_ranges(data: &Path, path: &str, quick: bool) -> (Vec<serde_json::Value>, u64) {
    let mut args = vec!["verify", "--json", path];
    if quick {
        args.insert(2, "--quick");
    }
    let v = json(&run_in(data, &args).stdout);
    let ranges = v["segments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["problems"].as_array().unwrap().iter())
        .filter(|p| p["severity"] == "corrupt")
        .map(|p| {
            serde_json::json!([
                p["first_unreadable_offset"],
                p["first_unreadable_position"],
                p["next_readable_offset"],
                p["next_readable_position"]
            ])
        })
        .collect();
    (ranges, v["totals"]["records"].as_u64().unwrap())
}

/// A bit flipped in a sealed record's length (the README's fixture recipe) hides that
/// record only: verify, the startup check (recover --dry-run) and dump all resume at
/// the next record, as a fetch does (docs/FORMAT.md, Reading around damage), and count
/// the records after the damage as readable. Two damaged records make two ranges; a
/// damaged last record resumes in the next segment.
#[test]
fn damage_in_a_sealed_segment_hides_only_the_records_it_touches() {
    let (_tmp, data) = copy("clean");
    let recs = record_positions(&fs::read(data.join(SEALED)).unwrap());
    assert_eq!(recs.len(), 30);
    let at = |i: usize| recs[i].0;
    // One bit of record 10's record_len: the length no longer fits its fields.
    damaged(
        &data,
        &["--flip-bit", &format!("{SEALED}:{}:0", at(10) + 2)],
    );
    let p0 = s(&data.join(P0)).to_string();
    let (ranges, records) = unreadable_ranges(&data, &p0, false);
    assert_eq!(
        ranges,
        vec![serde_json::json!([10, at(10), 11, at(11)])],
        "verify"
    );
    assert_eq!(records, 69, "verify counts every record but offset 10");
    let v = json(&run_in(&data, &["verify", "--json", &p0]).stdout);
    let seg = &v["segments"][0];
    assert_eq!(
        (seg["first_offset"].clone(), seg["last_offset"].clone()),
        (0.into(), 29.into())
    );
    assert_eq!(seg["records"], 29);
    let detail = seg["problems"][0]["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!(
            "bytes {}..{} of this sealed segment cannot be read (offset 10 lost), records resume at byte {} (offset 11)",
            at(10),
            at(11),
            at(11)
        )),
        "{detail}"
    );
    let r = run_in(&data, &["verify", &p0]);
    assert!(r.stdout.contains("69 records read"), "{}", r.stdout);
    // The startup check (recover plans from it) says the same.
    let r = run_in(&data, &["recover", "--dry-run", "--json", s(&data)]);
    r.code(2);
    let plan = json(&r.stdout);
    let lost: Vec<_> = plan["cannot_repair"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["offsets_lost"].clone(), d["bytes_lost"].clone()))
        .collect();
    assert_eq!(
        lost,
        vec![(
            serde_json::json!([10, 10]),
            serde_json::json!([at(10), at(11)])
        )],
        "{}",
        r.stdout
    );
    let r = run_in(&data, &["recover", "--dry-run", s(&data)]);
    assert!(
        r.stdout.contains(&format!(
            "(offset 10 lost), records resume at byte {} (offset 11)",
            at(11)
        )),
        "{}",
        r.stdout
    );
    // dump reads exactly the records verify counts, and names the same range.
    let lines = crate::util::bin::json_lines(&run_in(&data, &["dump", "--json", &p0]).stdout);
    let offsets: Vec<u64> = lines
        .iter()
        .filter(|l| l["type"] == "record")
        .map(|l| l["offset"].as_u64().unwrap())
        .collect();
    let want: Vec<u64> = (0..70).filter(|&o| o != 10).collect();
    assert_eq!(offsets, want);
    let problems: Vec<_> = lines.iter().filter(|l| l["type"] == "problem").collect();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0]["next_readable_offset"], 11);
    assert_eq!(problems[0]["next_readable_position"], at(11));

    // A second damaged record further on: a second range, the rest still read.
    damaged(
        &data,
        &["--flip-bit", &format!("{SEALED}:{}:0", at(20) + 2)],
    );
    let (ranges, records) = unreadable_ranges(&data, &p0, false);
    assert_eq!(
        ranges,
        vec![
            serde_json::json!([10, at(10), 11, at(11)]),
            serde_json::json!([20, at(20), 21, at(21)])
        ]
    );
    assert_eq!(records, 68);
    let plan = json(&run_in(&data, &["recover", "--dry-run", "--json", s(&data)]).stdout);
    let lost: Vec<_> = plan["cannot_repair"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["offsets_lost"].clone())
        .collect();
    assert_eq!(
        lost,
        vec![serde_json::json!([10, 10]), serde_json::json!([20, 20])]
    );

    // The last record of the segment damaged: reading resumes in the next segment.
    damaged(
        &data,
        &["--flip-bit", &format!("{SEALED}:{}:0", at(29) + 2)],
    );
    let (ranges, _) = unreadable_ranges(&data, &p0, true);
    assert_eq!(
        ranges,
        vec![
            serde_json::json!([10, at(10), 11, at(11)]),
            serde_json::json!([20, at(20), 21, at(21)]),
            serde_json::json!([29, at(29), 30, null])
        ],
        "verify --quick reads the damaged segment in full"
    );
    let (_, records) = unreadable_ranges(&data, &p0, false);
    assert_eq!(records, 67);
}

#[test]
fn truncate_the_active_segment_mid_record_is_repairable() {
    let (_tmp, data) = copy("clean");
    let before = tree(&data);
    let v = damaged(&data, &["--truncate", &format!("{ACTIVE}:1500")]);
    assert_eq!(v["action"], "truncate");
    assert_eq!(v["range"], serde_json::json!({"from": 1500, "to": 1559}));
    assert_eq!(v["file_bytes_after"], 1500);
    assert_eq!(v["bytes_before"], seglog::cmd::hex(&before[ACTIVE][1500..]));
    assert_eq!(v["bytes_after"], "");
    let after = tree(&data);
    assert_eq!(changed(&before, &after), vec![ACTIVE.to_string()]);
    assert_eq!(after[ACTIVE].as_slice(), &before[ACTIVE][..1500]);
    expect(&data, "repairable");
    assert_eq!(problem_kinds(&data), vec!["torn_tail"]);
}

#[test]
fn drop_index_is_repairable_and_reindex_makes_it_clean() {
    let (_tmp, data) = copy("clean");
    let before = tree(&data);
    let index = format!("{P0}/00000000000000000030.index");
    let v = damaged(&data, &["--drop-index", SEALED_30]);
    assert_eq!(v["action"], "drop_index");
    assert_eq!(v["file"], index);
    assert_eq!(v["bytes_before"], seglog::cmd::hex(&before[&index]));
    assert_eq!(v["file_bytes_after"], serde_json::Value::Null);
    let after = tree(&data);
    assert_eq!(changed(&before, &after), vec![index.clone()]);
    assert!(!after.contains_key(&index));
    expect(&data, "repairable");
    assert_eq!(problem_kinds(&data), vec!["missing_index"]);
    let r = run_in(&data, &["reindex", s(&data)]);
    r.code(0);
    expect(&data, "clean");
    assert_eq!(tree(&data), before, "reindex rebuilds the same bytes");
}

#[test]
fn zero_a_sealed_header_is_corrupt() {
    let (_tmp, data) = copy("clean");
    let before = tree(&data);
    let v = damaged(&data, &["--zero", &format!("{SEALED}:0:32")]);
    assert_eq!(v["action"], "zero");
    assert_eq!(v["range"], serde_json::json!({"from": 0, "to": 32}));
    assert_eq!(v["bytes_before"], seglog::cmd::hex(&before[SEALED][..32]));
    assert_eq!(v["bytes_after"], "00".repeat(32));
    let after = tree(&data);
    assert_eq!(changed(&before, &after), vec![SEALED.to_string()]);
    assert_eq!(&after[SEALED][..32], &[0u8; 32]);
    assert_eq!(&after[SEALED][32..], &before[SEALED][32..]);
    expect(&data, "corrupt");
    assert_eq!(problem_kinds(&data), vec!["zero_header"]);
}

#[test]
fn garbage_is_deterministic_from_the_seed_and_corrupts_a_sealed_segment() {
    let spec = format!("{SEALED_30}:2000:100");
    let mut reports = Vec::new();
    let mut bytes = Vec::new();
    for seed in ["9", "9", "10"] {
        let (_tmp, data) = copy("clean");
        let before = tree(&data);
        let v = damaged(&data, &["--garbage", &spec, "--seed", seed]);
        assert_eq!(v["action"], "garbage");
        assert_eq!(v["seed"], seed.parse::<u64>().unwrap());
        assert_eq!(v["range"], serde_json::json!({"from": 2000, "to": 2100}));
        assert_eq!(
            v["bytes_after"],
            serde_json::Value::Null,
            "100 bytes: not shown"
        );
        let after = tree(&data);
        assert_eq!(changed(&before, &after), vec![SEALED_30.to_string()]);
        let (old, new) = (&before[SEALED_30], &after[SEALED_30]);
        assert_eq!(old.len(), new.len());
        assert_eq!(&old[..2000], &new[..2000]);
        assert_eq!(&old[2100..], &new[2100..]);
        expect(&data, "corrupt");
        reports.push(v);
        bytes.push(new[2000..2100].to_vec());
    }
    assert_eq!(reports[0], reports[1]);
    assert_eq!(bytes[0], bytes[1], "the same seed gives the same bytes");
    assert_ne!(bytes[0], bytes[2], "another seed gives other bytes");
    // Small ranges are shown; without --seed the seed is 0.
    let (_tmp, data) = copy("clean");
    let v = damaged(&data, &["--garbage", &format!("{SEALED_30}:2000:8")]);
    assert_eq!(v["seed"], 0);
    // SplitMix64's first output for seed 0, little-endian.
    assert_eq!(v["bytes_after"], "afcd1d7b39a820e2");
}

#[test]
fn damage_refuses_a_directory_a_broker_holds() {
    let (_tmp, data) = copy("clean");
    // No spare maker: its empty spares would change the tree while it is held.
    let broker = Serve::start_with(&data, &["--new-spares", "0"]);
    let before = tree(&data);
    for path in [data.clone(), data.join(P0)] {
        let file = if path == data {
            SEALED
        } else {
            "00000000000000000000.log"
        };
        let r = run_in(
            &data,
            &["damage", s(&path), "--flip-bit", &format!("{file}:100:0")],
        );
        assert_eq!(r.code, 73, "{}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert!(r.stderr.contains(s(&data.join("LOCK"))), "{}", r.stderr);
        assert_eq!(r.stdout, "");
    }
    assert_eq!(tree(&data), before, "nothing changed while held");
    broker.stop();
    // Released: the same damage goes through (a forked child may hold the lock for a
    // moment; wait that out).
    let mut code = 73;
    for _ in 0..100 {
        code = damage(&data, &["--flip-bit", &format!("{SEALED}:100:0")]).code;
        if code != 73 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(code, 0);
}

#[test]
fn damage_takes_the_lock_of_the_data_directory_a_partition_is_in() {
    let (_tmp, data) = copy("clean");
    let lock = DirLock::acquire(&data).unwrap();
    let part = data.join(P0);
    let r = run_in(
        &data,
        &["damage", s(&part), "--drop-index", "00000000000000000000"],
    );
    assert_eq!(r.code, 73, "{}", r.stderr);
    assert!(part.join("00000000000000000000.index").exists());
    drop(lock);
    // A loose partition copy has no lock and gets no LOCK file.
    let tmp = tempfile::tempdir().unwrap();
    let loose = tmp.path().join("p0");
    copy_tree(&part, &loose);
    let before = tree(&loose);
    let v = damaged(&loose, &["--truncate", "00000000000000000060.log:1000"]);
    assert_eq!(v["file"], "00000000000000000060.log");
    let after = files(&loose);
    assert!(!after.contains_key("LOCK"));
    assert_eq!(
        changed(&before, &after),
        vec!["00000000000000000060.log".to_string()]
    );
    expect(&loose, "repairable");
}

#[test]
fn damage_bad_arguments_exit_64_naming_the_value() {
    let (tmp, data) = copy("clean");
    let outside = tmp.path().join("outside.log");
    fs::write(&outside, b"not part of the data directory").unwrap();
    std::os::unix::fs::symlink(&outside, data.join(P0).join("link.log")).unwrap();
    let before = tree(&data);
    let abs = s(&outside).to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--truncate".into(), format!("../{}:1", "outside.log")],
            "../outside.log",
        ),
        (vec!["--truncate".into(), format!("{abs}:1")], &abs),
        (
            vec!["--truncate".into(), format!("{P0}/link.log:1")],
            "link.log",
        ),
        (
            vec!["--flip-bit".into(), format!("{SEALED}:4549:0")],
            "byte 4549",
        ),
        (vec!["--flip-bit".into(), format!("{SEALED}:10:8")], "bit 8"),
        (
            vec!["--flip-bit".into(), format!("{SEALED}:ten:1")],
            "'ten'",
        ),
        (
            vec!["--flip-bit".into(), format!("{SEALED}:10")],
            "FILE:BYTE:BIT",
        ),
        (
            vec!["--truncate".into(), format!("{SEALED}:4549")],
            "length 4549",
        ),
        (vec!["--truncate".into(), format!("{SEALED}:-1")], "'-1'"),
        (
            vec!["--zero".into(), format!("{SEALED}:10:4550")],
            "TO 4550",
        ),
        (vec!["--zero".into(), format!("{SEALED}:10:10")], "FROM 10"),
        (
            vec!["--garbage".into(), format!("{SEALED}:4540:10")],
            "LEN 10",
        ),
        (vec!["--garbage".into(), format!("{SEALED}:0:0")], "LEN 0"),
        (
            vec![
                "--garbage".into(),
                format!("{SEALED}:18446744073709551615:2"),
            ],
            "FROM 18446744073709551615",
        ),
        (
            vec!["--truncate".into(), format!("{P0}/nothing.log:1")],
            "nothing.log",
        ),
        (vec!["--truncate".into(), format!("{P0}:1")], P0),
        (
            vec!["--drop-index".into(), format!("{P0}/topic.json")],
            "topic.json",
        ),
        (
            vec!["--drop-index".into(), format!("{P0}/00000000000000000090")],
            "00000000000000000090",
        ),
        (
            vec![
                "--truncate".into(),
                format!("{SEALED}:1"),
                "--seed".into(),
                "1".into(),
            ],
            "--garbage",
        ),
        (
            vec![
                "--truncate".into(),
                format!("{SEALED}:1"),
                "--zero".into(),
                format!("{SEALED}:0:1"),
            ],
            "--zero",
        ),
        (vec![], "--flip-bit"),
    ];
    for (args, named) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = damage(&data, &args);
        assert_eq!(r.code, 64, "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(named),
            "{args:?}: {:?} does not name {named}",
            r.stderr
        );
        assert_eq!(r.stdout, "", "{args:?}");
    }
    assert_eq!(tree(&data), before, "bad arguments change nothing");
    assert_eq!(
        fs::read(&outside).unwrap(),
        b"not part of the data directory"
    );
    // PATH that is not a directory.
    let r = run_in(
        &data,
        &["damage", s(&data.join(SEALED)), "--truncate", "x:1"],
    );
    assert_eq!(r.code, 64, "{}", r.stderr);
}

#[test]
fn damage_refuses_a_path_holding_no_seglog_data_and_files_outside_its_partitions() {
    // A directory of someone else's files: refused (64), nothing changed or created.
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk");
    fs::create_dir_all(junk.join("sub")).unwrap();
    fs::write(junk.join("sub/a.txt"), b"hi\n").unwrap();
    let before = files(&junk);
    for args in [
        ["--truncate", "sub/a.txt:1"],
        ["--flip-bit", "sub/a.txt:0:0"],
    ] {
        let r = damage(&junk, &args);
        assert_eq!(r.code, 64, "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert!(r.stderr.contains("is not a seglog"), "{}", r.stderr);
        assert!(r.stderr.contains(s(&junk)), "{}", r.stderr);
        assert_eq!(r.stdout, "");
        assert_eq!(files(&junk), before, "{args:?} touched nothing");
    }
    // A partition directory: a file in a subdirectory of it is not one of its files.
    let (_tmp, data) = copy("clean");
    let part = data.join(P0);
    fs::create_dir_all(part.join("sub")).unwrap();
    fs::write(part.join("sub/a.txt"), b"hi\n").unwrap();
    let before = tree(&data);
    for path in [part.clone(), data.join("topics/events")] {
        let r = damage(&path, &["--truncate", "sub/a.txt:1"]);
        assert_eq!(r.code, 64, "{}", r.stderr);
        assert!(r.stderr.contains("sub/a.txt"), "{}", r.stderr);
    }
    assert_eq!(tree(&data), before);
    // A topic directory: files of its partitions go through.
    let v = damaged(
        &data.join("topics/events"),
        &["--truncate", "0/00000000000000000060.log:1000"],
    );
    assert_eq!(v["file_bytes_after"], 1000);
}
