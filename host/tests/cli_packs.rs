//! `berth import`, `list`, `show`, `rm` and `plugins` as a user runs them.

mod common;

use common::*;
use std::path::Path;

fn install_scripted(home: &Path) {
    berth_ok(
        home,
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
}

#[test]
fn list_shows_a_scripted_pack_served_by_its_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    install_scripted(&home);
    let src = tmp.path().join("src");
    write_scripted_pack(
        &src,
        "echo",
        "v1",
        &serde_json::json!({"entries": [{"reply": [5]}]}),
    );
    let out = berth_ok(&home, None, &["import", src.to_str().unwrap()]);
    assert!(out.contains("echo:v1"), "{out}");

    let table = berth_ok(&home, None, &["list"]);
    let header = table.lines().next().unwrap();
    for col in [
        "NAME",
        "FAMILY",
        "PARAMS",
        "QUANT",
        "SIZE",
        "CAPABILITIES",
        "PLUGIN",
        "MODIFIED",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let row = table
        .lines()
        .find(|l| l.starts_with("echo:v1"))
        .expect("pack listed");
    assert!(row.contains("scripted") && row.contains(" ok "), "{row}");

    let json: serde_json::Value = serde_json::from_str(&berth_ok(&home, None, &["list", "--json"])).unwrap();
    assert_eq!(json[0]["name"], "echo:v1");
    assert_eq!(json[0]["plugin"], "ok");
    assert_eq!(json[0]["plugin_name"], "scripted");

    berth_ok(&home, None, &["rm", "echo:v1"]);
    let json: serde_json::Value = serde_json::from_str(&berth_ok(&home, None, &["list", "--json"])).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 0);
}

#[test]
fn broken_packs_are_listed_with_their_error_and_hide_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    install_scripted(&home);
    for name in ["good", "truncated", "badsha", "missing", "badtoml", "nofamily"] {
        let src = tmp.path().join(name);
        write_scripted_pack(
            &src,
            name,
            "latest",
            &serde_json::json!({"entries": [{"reply": [5, 6, 7]}]}),
        );
        berth_ok(&home, None, &["import", src.to_str().unwrap()]);
    }
    let packs = home.join("packs");
    let script = |n: &str| packs.join(n).join("latest/script.json");
    let text = std::fs::read_to_string(script("truncated")).unwrap();
    std::fs::write(script("truncated"), &text[..text.len() / 2]).unwrap();
    std::fs::write(script("badsha"), text.replace('5', "9")).unwrap();
    std::fs::remove_file(script("missing")).unwrap();
    std::fs::write(
        packs.join("badtoml/latest/pack.toml"),
        "name = \"badtoml\"\nfamily = [unclosed\n",
    )
    .unwrap();
    let toml_path = packs.join("nofamily/latest/pack.toml");
    let t = std::fs::read_to_string(&toml_path)
        .unwrap()
        .replace("family = \"scripted\"", "family = \"martian\"");
    std::fs::write(&toml_path, t).unwrap();

    let out = berth(&home, None, &["list"]);
    assert!(out.status.success(), "list must not fail on broken packs");
    let table = String::from_utf8_lossy(&out.stdout);
    for name in ["good", "truncated", "badsha", "missing", "badtoml", "nofamily"] {
        assert!(
            table.lines().any(|l| l.starts_with(&format!("{name}:latest"))),
            "{name} hidden:\n{table}"
        );
    }
    let good = table.lines().find(|l| l.starts_with("good:latest")).unwrap();
    assert!(good.contains(" ok "), "{good}");
    let problems = |name: &str| -> String {
        table
            .lines()
            .filter(|l| l.starts_with(&format!("{name}:latest: ")))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(problems("truncated").contains("size"), "{table}");
    assert!(problems("badsha").contains("sha256"), "{table}");
    assert!(problems("missing").contains("missing"), "{table}");
    assert!(problems("badtoml").contains("pack.toml"), "{table}");
    assert!(
        problems("nofamily").contains("unknown family 'martian'"),
        "{table}"
    );
    assert!(problems("good").is_empty(), "{table}");
}

#[test]
fn show_of_the_real_ggufs_prints_architecture_quant_mix_context_and_template_state() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let qwen = real_model("qwen2.5-coder-0.5b");
    let gemma = real_model("gemma3-270m");
    berth_ok(
        &home,
        None,
        &["import", qwen.to_str().unwrap(), "--name", "qwen2.5-coder:0.5b"],
    );
    berth_ok(
        &home,
        None,
        &["import", gemma.to_str().unwrap(), "--name", "gemma3:270m"],
    );

    let q = berth_ok(&home, None, &["show", "qwen2.5-coder:0.5b"]);
    assert!(q.contains("architecture        qwen2"), "{q}");
    assert!(q.contains("family              qwen3"), "{q}");
    assert!(q.contains("context length      32768"), "{q}");
    for t in ["Q5_0", "Q8_0", "Q6_K", "Q4_K"] {
        assert!(
            q.lines()
                .any(|l| l.trim_start().starts_with(t) && l.contains("tensors")),
            "{t} missing:\n{q}"
        );
    }
    assert!(q.contains("embedded in the GGUF"), "{q}");
    assert!(q.contains("tools"), "{q}");

    let g = berth_ok(&home, None, &["show", "gemma3:270m"]);
    assert!(g.contains("architecture        gemma3"), "{g}");
    assert!(g.contains("family              gemma"), "{g}");
    assert!(g.contains("context length      32768"), "{g}");
    assert!(g.contains("Q4_K") && g.contains("Q6_K"), "{g}");
    assert!(g.contains("none embedded"), "{g}");

    let json: serde_json::Value =
        serde_json::from_str(&berth_ok(&home, None, &["show", "gemma3", "--json"])).unwrap();
    assert_eq!(json["manifest"]["architecture"], "gemma3");
    assert_eq!(json["template"], "none embedded");
}

#[test]
fn plugins_lists_installed_plugins_with_their_abi() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    install_scripted(&home);
    let out = berth_ok(&home, None, &["plugins"]);
    let row = out
        .lines()
        .find(|l| l.contains("libberth_scripted.so"))
        .expect("listed");
    assert!(
        row.contains("scripted")
            && row.contains(&format!("1.{}", berth_plugin_api::abi::ABI_MINOR))
            && row.ends_with("ok"),
        "{row}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&berth_ok(&home, None, &["plugins", "--json"])).unwrap();
    let scripted = json
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["file"].as_str().unwrap().ends_with("libberth_scripted.so"))
        .expect("scripted listed");
    assert_eq!(scripted["status"], "ok");
    assert_eq!(scripted["manifest"]["families"][0], "scripted");
}

#[test]
fn output_piped_into_a_reader_that_stops_early_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    install_scripted(&home);
    let src = tmp.path().join("src");
    write_scripted_pack(
        &src,
        "echo",
        "v1",
        &serde_json::json!({"entries": [{"reply": [5]}]}),
    );
    berth_ok(&home, None, &["import", src.to_str().unwrap()]);
    // `head -c 1` closes the pipe after one byte; each command runs several times so that some
    // of its writes certainly come after the reader has gone.
    for args in ["man", "show echo:v1 --json", "list --json", "completions bash"] {
        let script =
            format!("for i in 1 2 3 4 5 6 7 8; do \"$0\" --home \"$1\" {args}; done | head -c 1 >/dev/null");
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                &script,
                berth_exe().to_str().unwrap(),
                home.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "berth {args} | head: {stderr}"
        );
    }
}

#[test]
fn create_from_a_modelfile_then_show_modelfile_creates_the_same_pack_again() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let dir = tmp.path().join("models");
    std::fs::create_dir(&dir).unwrap();
    let template = "{% for m in messages %}{{ m.content }}{% endfor %}";
    std::fs::write(
        dir.join("tiny.gguf"),
        berth_registry::testutil::sample_gguf(Some(template)),
    )
    .unwrap();
    let modelfile = dir.join("Modelfile");
    std::fs::write(
        &modelfile,
        "# FROM resolves against the Modelfile's folder\nfrom ./tiny.gguf\n\
         SYSTEM \"\"\"You are terse.\nVery terse.\"\"\"\nPARAMETER temperature 0\n\
         PARAMETER stop \"<|im_end|>\"\nPARAMETER stop \"say \\\"stop\\\"\"\nPARAMETER num_ctx 2048\n\
         MESSAGE user \"Hi there\"\nMESSAGE assistant Hello\nLICENSE MIT\n",
    )
    .unwrap();
    let out = berth_ok(
        &home,
        None,
        &["create", "mine:v1", "-f", modelfile.to_str().unwrap()],
    );
    let steps: Vec<&str> = out.lines().collect();
    assert_eq!(steps.first(), Some(&"parsing modelfile"), "{out}");
    assert_eq!(steps.last(), Some(&"success"), "{out}");
    for step in [
        "reading model metadata",
        "writing system prompt",
        "writing parameters",
        "writing manifest",
    ] {
        assert!(steps.contains(&step), "{step} missing from {out}");
    }

    let text = berth_ok(&home, None, &["show", "mine:v1", "--modelfile"]);
    assert!(text.contains("FROM mine:v1\n"), "{text}");
    assert!(text.contains("PARAMETER stop \"<|im_end|>\"\n"), "{text}");
    assert!(
        text.contains(&format!("TEMPLATE \"\"\"{template}\"\"\"")),
        "{text}"
    );
    let again = tmp.path().join("Modelfile.again");
    std::fs::write(&again, &text).unwrap();
    berth_ok(&home, None, &["create", "mine:v2", "-f", again.to_str().unwrap()]);
    let load = |tag: &str| berth_registry::PackManifest::load(&home.join("packs/mine").join(tag)).unwrap();
    let (a, b) = (load("v1"), load("v2"));
    assert_eq!(a.system.as_deref(), Some("You are terse.\nVery terse."));
    assert_eq!(a.defaults["stop"].as_array().map(Vec::len), Some(2));
    assert_eq!(a.messages[0].content, "Hi there");
    assert_eq!(
        (&a.defaults, &a.system, &a.messages, &a.license, &a.capabilities),
        (&b.defaults, &b.system, &b.messages, &b.license, &b.capabilities)
    );
    assert_eq!(
        std::fs::read_to_string(home.join("packs/mine/v2/chat_template.jinja")).unwrap(),
        template
    );

    for (body, expected) in [
        (
            "FROM mine:v1\nTEMPLATE \"{{ .Prompt }}\"\n",
            "line 2: TEMPLATE looks like a Go template",
        ),
        (
            "FROM mine:v1\n\nADAPTER ./lora.gguf\n",
            "line 3: ADAPTER: adapters are not supported yet",
        ),
        (
            "FROM mine:v1\nPARAMETER num_gpu 1\n",
            "line 2: parameter num_gpu is not supported by Berth",
        ),
        ("FROM ./nothing.gguf\n", "no such file or folder"),
        ("FROM mine:v1\nTEMPLATE \"{% if %}\"\n", "TEMPLATE: chat template"),
    ] {
        std::fs::write(dir.join("Bad"), body).unwrap();
        let out = berth(
            &home,
            None,
            &["create", "bad", "-f", dir.join("Bad").to_str().unwrap()],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(expected),
            "{body}: {stderr}"
        );
    }
    let list = berth_ok(&home, None, &["list"]);
    assert!(!list.contains("bad"), "{list}");
}
