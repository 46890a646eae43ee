//! Fuzzes the Modelfile parser (`berth_registry::modelfile`): any text through `parse` and
//! `parse_partial` must be a Modelfile or an error naming a line, never a panic. `parse` accepts
//! what `parse_partial` accepts plus a `FROM`; a parsed Modelfile applied to a pack and written
//! back as a Modelfile (`render`, what `/api/show` answers) must parse back to the same pack
//! values.

#![no_main]

use berth_registry::modelfile::{render, Modelfile};
use berth_registry::{PackManifest, PackRef};
use libfuzzer_sys::fuzz_target;

fn pack() -> PackManifest {
    PackManifest::new(
        &PackRef::parse("fuzz:latest").expect("a valid reference"),
        "qwen3",
    )
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let partial = Modelfile::parse_partial(&text);
    let whole = Modelfile::parse(&text);
    match (&partial, &whole) {
        (Ok(p), Ok(w)) => assert_eq!(p, w, "parse and parse_partial disagree"),
        (Ok(p), Err(_)) => assert!(p.from.is_none(), "parse refused a Modelfile with FROM"),
        (Err(_), Ok(_)) => panic!("parse accepted what parse_partial refused"),
        (Err(_), Err(_)) => {}
    }
    let Ok(mf) = partial else { return };
    let mut first = pack();
    mf.apply(&mut first);
    let written = render("base", mf.template.as_deref(), &first);
    let back = Modelfile::parse(&written)
        .unwrap_or_else(|e| panic!("a written Modelfile does not parse back: {e}\n{written}"));
    let mut second = pack();
    back.apply(&mut second);
    assert_eq!(
        (
            &second.defaults,
            &second.system,
            &second.messages,
            &second.license
        ),
        (&first.defaults, &first.system, &first.messages, &first.license),
        "a written Modelfile parses back to other values:\n{written}"
    );
    assert_eq!(back.template, mf.template, "the template changed:\n{written}");
});
