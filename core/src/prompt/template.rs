//! Chat-template compilation and rendering, as the Dynamo 1.6.1 frontend does it.
//!
//! Role: compile the model's chat template (tokenizer_config.json `chat_template`, or the card's
//! `chat_template_file` as `.jinja` text or a `{"chat_template": ...}` JSON file) into an owned
//! minijinja environment configured like 1.6.1 (dynamo-renderer 8.0.3
//! `HfTokenizerConfigJsonFormatter::with_options`): `lstrip_blocks` + `trim_blocks`, the
//! Undefined/None-tolerant `length` filter, pycompat methods, Python `trim`/`tojson`/`string`,
//! Python float output, `fromjson`/`from_json`, `raise_exception`, `strftime_now`. A string
//! template is registered as both `default` and `tool_use`; the list form registers every
//! `key: source` pair of every map, exactly as 1.6.1 (so HF's `[{name, template}]` lists fail to
//! find `default` there as here). `tool_use` renders when `tools` is a non-empty list (after
//! `tool_choice: "none"` drops them, 1.6.1's default `exclude_tools_when_tool_choice_none`).
//! Context: `messages`, `tools`, `bos_token`, `eos_token`, `unk_token`, `add_generation_prompt`,
//! then `chat_template_args`, which override them (1.6.1 `context! { ..ctx, ..extra }`: in a
//! minijinja 2.24 merge the last map wins).
//!
//! Invariants (KV-TOK-13): no loader (templates cannot read files), a fuel budget of
//! [`FUEL`] per render, output capped at [`MAX_OUTPUT_BYTES`] by a writer that fails past the
//! cap; every failure is a [`RenderError`], never a panic.

use std::io;

use minijinja::value::ValueKind;
use minijinja::{Environment, ErrorKind, Value, context};
use serde::Deserialize;

use super::messages;
use super::pyfmt;
use super::request::ChatRequest;

/// The instruction budget of one render (KV-TOK-13).
pub const FUEL: u64 = 5_000_000;
pub use super::MAX_OUTPUT_BYTES;

/// Where the chat template comes from when the card has a `chat_template_file` slot.
#[derive(Debug, Clone, Copy)]
pub enum TemplateFile<'a> {
    /// A `.jinja` file's text (1.6.1 `HfChatTemplateJinja`).
    Jinja(&'a str),
    /// A `chat_template.json` file's text with a `chat_template` field (`HfChatTemplateJson`).
    Json(&'a str),
}

/// Why a chat template cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// tokenizer_config.json or the template JSON file does not parse.
    #[error("tokenizer config / chat template json: {0}")]
    Json(#[from] serde_json::Error),
    /// No `chat_template` anywhere.
    #[error("no chat_template in tokenizer_config.json or chat_template_file")]
    Missing,
    /// The list form holds no template.
    #[error("chat_template list holds no template")]
    Empty,
    /// The template does not compile.
    #[error("chat template syntax: {0}")]
    Syntax(#[from] minijinja::Error),
}

/// Why one render failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The output passed [`MAX_OUTPUT_BYTES`].
    #[error("rendered prompt exceeds {MAX_OUTPUT_BYTES} bytes")]
    OutputTooLarge,
    /// The fuel budget ran out.
    #[error("chat template ran out of fuel")]
    OutOfFuel,
    /// Any other template error (`raise_exception`, undefined call, type error, …).
    #[error("chat template render: {0}")]
    Template(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TokenValue {
    Plain(String),
    Added { content: String },
}

impl TokenValue {
    fn into_content(self) -> String {
        match self {
            Self::Plain(s) | Self::Added { content: s } => s,
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateValue {
    One(String),
    Named(Vec<std::collections::HashMap<String, String>>),
}

#[derive(Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    bos_token: Option<TokenValue>,
    #[serde(default)]
    eos_token: Option<TokenValue>,
    #[serde(default)]
    unk_token: Option<TokenValue>,
    #[serde(default)]
    chat_template: Option<TemplateValue>,
}

#[derive(Deserialize)]
struct TemplateJsonFile {
    chat_template: Option<TemplateValue>,
}

/// Per-template capabilities, probed once at compile time as 1.6.1 does.
#[derive(Debug, Clone, Copy, Default)]
struct Caps {
    handles_reasoning: bool,
    arguments_string: bool,
}

/// A compiled chat template with its special tokens. `Send + Sync`; shared read-only.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: Option<String>,
    eos: Option<String>,
    unk: Option<String>,
    requires_content_arrays: bool,
    default_caps: Caps,
    tool_use_caps: Caps,
}

/// An `io::Write` into a reused buffer that fails once the cap would be passed.
struct CappedWriter<'a> {
    buf: &'a mut Vec<u8>,
    overflowed: bool,
}

impl io::Write for CappedWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > MAX_OUTPUT_BYTES {
            self.overflowed = true;
            return Err(io::Error::other("rendered prompt too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn length_filter(value: Value) -> usize {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => 0,
        _ => value.len().unwrap_or(0),
    }
}

fn new_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_lstrip_blocks(true);
    env.set_trim_blocks(true);
    env.set_fuel(Some(FUEL));
    env.add_filter("length", length_filter);
    env.set_unknown_method_callback(pyfmt::python_methods);
    env.add_filter("trim", pyfmt::python_trim);
    env.add_filter("tojson", pyfmt::tojson);
    env.add_filter("string", pyfmt::python_string);
    env.set_formatter(pyfmt::python_formatter);
    env.add_filter("fromjson", pyfmt::fromjson);
    env.add_filter("from_json", pyfmt::fromjson);
    env.add_function("raise_exception", pyfmt::raise_exception);
    env.add_function("strftime_now", pyfmt::strftime_now);
    env
}

impl ChatTemplate {
    /// Compiles the template of `tokenizer_config_json`, or of `file` when the card has one.
    pub fn new(
        tokenizer_config_json: &[u8],
        file: Option<TemplateFile<'_>>,
    ) -> Result<Self, TemplateError> {
        let config: TokenizerConfig = serde_json::from_slice(tokenizer_config_json)?;
        let template = match file {
            Some(TemplateFile::Jinja(text)) => Some(TemplateValue::One(text.to_owned())),
            Some(TemplateFile::Json(text)) => {
                let f: TemplateJsonFile = serde_json::from_str(text)?;
                Some(f.chat_template.ok_or(TemplateError::Missing)?)
            }
            None => config.chat_template,
        };
        let mut env = new_environment();
        match template.ok_or(TemplateError::Missing)? {
            TemplateValue::One(src) => {
                env.add_template_owned("default", src.clone())?;
                env.add_template_owned("tool_use", src)?;
            }
            TemplateValue::Named(maps) => {
                for map in maps {
                    for (name, src) in map {
                        env.add_template_owned(name, src)?;
                    }
                }
                if env.templates().count() == 0 {
                    return Err(TemplateError::Empty);
                }
            }
        }
        let mut t = Self {
            env,
            bos: config.bos_token.map(TokenValue::into_content),
            eos: config.eos_token.map(TokenValue::into_content),
            unk: config.unk_token.map(TokenValue::into_content),
            requires_content_arrays: false,
            default_caps: Caps::default(),
            tool_use_caps: Caps::default(),
        };
        t.requires_content_arrays = t.detect_content_array_usage();
        t.default_caps = t.caps("default", None);
        let probe_tools = serde_json::json!([{"type": "function", "function": {"name": "probe",
            "description": "", "parameters": {"type": "object", "properties": {}}}}]);
        t.tool_use_caps = t.caps("tool_use", Some(probe_tools));
        Ok(t)
    }

    fn source_contains(&self, name: &str, needle: &str) -> Option<bool> {
        self.env
            .get_template(name)
            .ok()
            .map(|t| t.source().contains(needle))
    }

    fn probe(&self, name: &str, ctx: Value) -> Option<String> {
        self.env.get_template(name).ok()?.render(ctx).ok()
    }

    /// 1.6.1 `detect_content_array_usage`: the array probe renders the text, the string one not.
    fn detect_content_array_usage(&self) -> bool {
        let arr = serde_json::json!([{"role": "user", "content": [{"type": "text", "text": "template_test"}]}]);
        let s = serde_json::json!([{"role": "user", "content": "template_test"}]);
        let render = |m: serde_json::Value| {
            self.probe(
                "default",
                context! { messages => m, add_generation_prompt => false },
            )
            .unwrap_or_default()
        };
        render(arr).contains("template_test") && !render(s).contains("template_test")
    }

    /// 1.6.1 `template_handles_reasoning` and `detect_tool_calls_arguments_string`.
    fn caps(&self, name: &str, tools: Option<serde_json::Value>) -> Caps {
        let Some(handles_reasoning) = self.source_contains(name, "reasoning_content") else {
            return Caps::default();
        };
        let arguments_string = self.source_contains(name, "arguments is string") == Some(true) && {
            let arguments = r#"{"probe": "value"}"#;
            let m = serde_json::json!([
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "call_probe",
                    "type": "function", "function": {"name": "probe", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "call_probe", "content": "r"}
            ]);
            let ctx = context! { messages => m, add_generation_prompt => true, tools => tools,
            bos_token => self.bos, eos_token => self.eos, unk_token => self.unk };
            self.probe(name, ctx).is_some_and(|r| r.contains(arguments))
        };
        Caps {
            handles_reasoning,
            arguments_string,
        }
    }

    /// Renders `req` into `out` (cleared first), `now_unix_secs` feeding `strftime_now`.
    pub fn render(
        &self,
        req: &ChatRequest,
        now_unix_secs: i64,
        out: &mut Vec<u8>,
    ) -> Result<(), RenderError> {
        out.clear();
        // 1.6.1's default `exclude_tools_when_tool_choice_none` (true).
        let drop_tools =
            req.tool_choice.as_ref().and_then(serde_json::Value::as_str) == Some("none");
        let tools = match &req.tools {
            Some(t) if !drop_tools => Some(messages::fix_tool_schema(t)),
            _ => None,
        };
        let has_tools = tools
            .as_ref()
            .and_then(serde_json::Value::as_array)
            .is_some_and(|a| !a.is_empty());
        let (name, caps) = if has_tools {
            ("tool_use", self.tool_use_caps)
        } else {
            ("default", self.default_caps)
        };
        let mut msgs = req.messages.clone();
        messages::fix_content(&mut msgs, self.requires_content_arrays);
        if !caps.arguments_string {
            messages::parse_tool_call_arguments(&mut msgs);
        }
        messages::parse_function_call_arguments(&mut msgs);
        if !caps.handles_reasoning {
            messages::inject_reasoning(&mut msgs);
        }
        let base = context! {
            messages => Value::from_serialize(&msgs),
            tools => tools.map(|t| Value::from_serialize(&t)),
            bos_token => self.bos,
            eos_token => self.eos,
            unk_token => self.unk,
            add_generation_prompt => req.add_generation_prompt,
        };
        let hidden = Value::from_iter([(pyfmt::NOW_VAR, Value::from(now_unix_secs))]);
        let ctx = match &req.chat_template_args {
            Some(args) => minijinja::value::merge_maps([base, Value::from_serialize(args), hidden]),
            None => minijinja::value::merge_maps([base, hidden]),
        };
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| RenderError::Template(e.to_string()))?;
        let mut w = CappedWriter {
            buf: out,
            overflowed: false,
        };
        match tmpl.render_captured_to(ctx, &mut w) {
            Ok(_) => Ok(()),
            Err(_) if w.overflowed => Err(RenderError::OutputTooLarge),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(RenderError::OutOfFuel),
            Err(e) => Err(RenderError::Template(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(template: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": template,
        }))
        .unwrap()
    }

    fn render(template: &str, body: &str) -> Result<String, RenderError> {
        let t = ChatTemplate::new(&cfg(template), None).unwrap();
        let req = ChatRequest::parse(body.as_bytes()).unwrap();
        let mut out = Vec::new();
        t.render(&req, 1_709_211_909, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn tokens_generation_prompt_and_python_helpers() {
        let out = render(
            "{{ bos_token }}{% for m in messages %}{{ m.content | trim }}|{% endfor %}{{ eos_token }}\
             {% if add_generation_prompt %}G{% endif %}{{ strftime_now('%d %b %Y') }}{{ {'a': 1.0, 'b': [1, 'x']} | tojson }}",
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":" a"},{"type":"text","text":"b "}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            out,
            "<s>a\nb|</s>G29 Feb 2024{\"a\": 1.0, \"b\": [1, \"x\"]}"
        );
    }

    #[test]
    fn tool_use_template_and_template_args() {
        let cfg = serde_json::to_vec(&serde_json::json!({
            "chat_template": [{"default": "D{{ x }}{{ messages | length }}"}, {"tool_use": "T{{ tools | length }}{{ tools[0].function.description }}"}]
        }))
        .unwrap();
        let t = ChatTemplate::new(&cfg, None).unwrap();
        let mut out = Vec::new();
        let req = ChatRequest::parse(br#"{"messages":[{"role":"user","content":"x"}],"chat_template_args":{"x":"!","messages":[]}}"#).unwrap();
        t.render(&req, 0, &mut out).unwrap();
        assert_eq!(out, b"D!0"); // chat_template_args override `messages`, as in 1.6.1
        let req = ChatRequest::parse(
            br#"{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}]}"#,
        )
        .unwrap();
        t.render(&req, 0, &mut out).unwrap();
        assert_eq!(out, b"T1");
        let req = ChatRequest::parse(br#"{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"}"#).unwrap();
        t.render(&req, 0, &mut out).unwrap();
        assert_eq!(out, b"D0");
    }

    #[test]
    fn limits_and_errors_are_typed() {
        assert!(matches!(
            render(
                "{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                r#"{"messages":[]}"#
            ),
            Err(RenderError::OutOfFuel)
        ));
        assert!(matches!(
            render(
                "{% for i in range(2000) %}{% for j in range(100) %}0123456789{% endfor %}{% endfor %}",
                r#"{"messages":[]}"#
            ),
            Err(RenderError::OutputTooLarge)
        ));
        assert!(matches!(
            render("{{ raise_exception('no') }}", r#"{"messages":[]}"#),
            Err(RenderError::Template(_))
        ));
        assert!(matches!(
            render("{% include 'x' %}", r#"{"messages":[]}"#),
            Err(RenderError::Template(_))
        ));
        assert!(ChatTemplate::new(&cfg("{% if %}"), None).is_err());
        assert!(ChatTemplate::new(b"{}", None).is_err());
    }

    #[test]
    fn tojson_of_client_data_is_capped_and_its_indent_bounded() {
        // ~150 KB of tools, pretty-printed at indent 64: over 1 MiB, refused at the cap.
        let tools: Vec<String> = (0..30_000).map(|i| format!("t{i}")).collect();
        let body = serde_json::json!({"messages": [], "tools": tools}).to_string();
        assert!(render("{{ tools | tojson(indent=64) }}", &body).is_err());
        // The same at indent 2 fits; a huge indent is refused before anything is allocated.
        assert!(render("{{ tools | tojson(indent=2) }}", &body).is_ok());
        assert!(render("{{ tools | tojson(indent=65) }}", &body).is_err());
        assert!(render("{{ tools | tojson(indent=100000000000) }}", &body).is_err());
    }

    #[test]
    fn template_file_overrides_config() {
        let t = ChatTemplate::new(&cfg("A"), Some(TemplateFile::Jinja("B"))).unwrap();
        let mut out = Vec::new();
        t.render(
            &ChatRequest::parse(br#"{"messages":[]}"#).unwrap(),
            0,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, b"B");
        let t = ChatTemplate::new(
            &cfg("A"),
            Some(TemplateFile::Json(r#"{"chat_template":"C"}"#)),
        )
        .unwrap();
        t.render(
            &ChatRequest::parse(br#"{"messages":[]}"#).unwrap(),
            0,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, b"C");
    }
}
