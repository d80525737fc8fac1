//! Documents derived from the parameter declarations: the JSON Schema and the rule reference.

use serde_json::{Map, Value as J, json};

use crate::check::placeholder_list;
use crate::policy::parse_default;
use crate::schema::{Field, Kind, PLACEHOLDERS, POLICY, kind_name};

/// A JSON Schema (draft-07, which yaml-language-server reads) of the policy format.
pub fn json_schema() -> J {
    let mut root = section_schema(POLICY.fields);
    if let J::Object(map) = &mut root {
        map.insert(
            "$schema".into(),
            json!("http://json-schema.org/draft-07/schema#"),
        );
        map.insert(
            "$id".into(),
            json!("https://loopguard.invalid/policy.schema.json"),
        );
        map.insert("title".into(), json!("loopguard policy"));
    }
    root
}

fn section_schema(fields: &'static [Field]) -> J {
    let mut props = Map::new();
    for field in fields {
        let mut schema = kind_schema(&field.kind);
        if let J::Object(map) = &mut schema {
            map.insert("description".into(), json!(doc(field)));
            if let Some(default) = field.default {
                map.insert("default".into(), parse_default(default).to_json());
            }
        }
        props.insert(field.key.into(), schema);
    }
    let required: Vec<&str> = fields
        .iter()
        .filter(|f| f.required)
        .map(|f| f.key)
        .collect();
    let mut schema = json!({
        "type": ["object", "null"],
        "properties": props,
        "additionalProperties": false,
    });
    if !required.is_empty() {
        schema["type"] = json!("object");
        schema["required"] = json!(required);
    }
    schema
}

fn kind_schema(kind: &'static Kind) -> J {
    match kind {
        Kind::Bool => json!({"type": "boolean"}),
        Kind::Int { min, max } => json!({"type": "integer", "minimum": min, "maximum": max}),
        Kind::Str => json!({"type": "string"}),
        Kind::Enum(words) => json!({"type": "string", "enum": words}),
        Kind::Regex => json!({"type": "string", "format": "regex"}),
        Kind::Glob => json!({"type": "string", "minLength": 1}),
        Kind::Template => json!({"type": "string"}),
        Kind::List(inner) => json!({"type": ["array", "null"], "items": kind_schema(inner)}),
        Kind::Section(fields) => section_schema(fields),
        Kind::Map(inner) => {
            json!({"type": ["object", "null"], "additionalProperties": kind_schema(inner)})
        }
        Kind::Any => json!({}),
    }
}

/// A field's documentation; a message template's ends with the placeholders it may use.
fn doc(field: &Field) -> String {
    match field.kind {
        Kind::Template => format!("{}; placeholders: {}", field.doc, placeholder_list()),
        _ => field.doc.to_owned(),
    }
}

/// The rule reference (docs/reference.md), as Markdown: one row per key, in declaration order,
/// then one row per message placeholder.
pub fn reference_markdown() -> String {
    let mut out = String::from("| key | type | default | description |\n|---|---|---|---|\n");
    rows(POLICY.fields, "", &mut out);
    out.push_str("\n| placeholder | stands for |\n|---|---|\n");
    for p in PLACEHOLDERS {
        out.push_str(&format!("| `{{{}}}` | {} |\n", p.name, p.doc));
    }
    out
}

fn rows(fields: &'static [Field], prefix: &str, out: &mut String) {
    for field in fields {
        let key = format!("{prefix}{}", field.key);
        let default = match field.default {
            Some(yaml) if yaml.contains('\n') => "see below".to_owned(),
            Some(yaml) => format!("`{}`", yaml.replace('|', "\\|")),
            None if field.required => "required".to_owned(),
            None => "—".to_owned(),
        };
        out.push_str(&format!(
            "| `{key}` | {} | {default} | {} |\n",
            kind_name(&field.kind),
            doc(field).replace('|', "\\|")
        ));
        match &field.kind {
            // Override entries repeat top-level sections; their keys are documented once above.
            Kind::Section(inner) if !prefix.starts_with("overrides") => {
                rows(inner, &format!("{key}."), out);
            }
            Kind::Map(inner) => match inner {
                Kind::Section(f) => rows(f, &format!("{key}.<name>."), out),
                Kind::List(Kind::Section(f)) => rows(f, &format!("{key}.<name>[]."), out),
                _ => {}
            },
            Kind::List(Kind::Section(f)) => rows(f, &format!("{key}[]."), out),
            _ => {}
        }
    }
}
