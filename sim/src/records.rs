//! The etcd records a Dynamo 1.6.1 worker registers, and where Dynamo's `FileStore` puts them.
//!
//! Role: pure builders of the three records the router reads: the `generate` Endpoint record
//! (`v1/instances/...`), the Model record with its card (`v1/mdc/...`) and the `kv_metrics`
//! EventChannel record (`v1/event_channels/...`); [`file_path`], the file of a key; and
//! [`fleet_of`], the fleet the router's reducer makes of some records.
//!
//! Invariants:
//! - shapes are copied from the real 1.6.1 dump (`shared/fixtures/dynamo-1.6.1/etcd-dump.txt`):
//!   same field names and nesting, `instance_id` in decimal in values and lowercase hex in keys;
//!   decode workers register as component `backend` with card `worker_type: "decode"` and
//!   `needs: [["prefill"]]`, prefill workers as component `prefill`;
//! - the cards name the tokenizer files of `shared/fixtures/tiny-model` with their real
//!   checksums (as the captured mocker fleet did); the simulator publishes no `kv-events`, so
//!   the cards say `kv_event_publishing_enabled: false`;
//! - a key's file is `root/v1/<bucket>/<rest of the key with every non-alphanumeric byte
//!   percent-encoded>` (upstream `Key::url_safe`), which the router's reader decodes back.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use continuum_core::discovery::keys::channel_key;
use continuum_core::discovery::{
    FleetView, InstanceId, KvEvent, PublisherId, Reducer, Role, UnixMillis,
};
use serde_json::Value;

/// The topic of load samples.
pub const KV_METRICS_TOPIC: &str = "kv_metrics";

/// What a worker's records say about it.
#[derive(Debug, Clone, Copy)]
pub struct WorkerRecord<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Component (`backend` or `prefill`).
    pub component: &'a str,
    /// Model name.
    pub model: &'a str,
    /// Role (the card's `worker_type`).
    pub role: Role,
    /// Instance id (the lease id).
    pub instance_id: InstanceId,
    /// Data-parallel ranks.
    pub dp_size: u32,
    /// Card `kv_cache_block_size`.
    pub block_size: u32,
    /// Card `total_kv_blocks`.
    pub total_kv_blocks: u64,
    /// The `host:port` put in the request-plane transport (nothing is served there).
    pub request_plane: &'a str,
    /// The `kv_metrics` publisher incarnation.
    pub publisher_id: PublisherId,
    /// The publisher's `tcp://host:port`.
    pub publisher_endpoint: &'a str,
}

impl<'a> WorkerRecord<'a> {
    /// Aggregated worker `id` of `model` in `namespace` (component `backend`, one rank, 1,000
    /// KV blocks of `block_size`), its request plane at `request_plane` and its `kv_metrics`
    /// publisher (id `id + 1`) at `publisher_endpoint`.
    pub fn aggregated(
        namespace: &'a str,
        model: &'a str,
        id: u64,
        block_size: u32,
        request_plane: &'a str,
        publisher_endpoint: &'a str,
    ) -> Self {
        WorkerRecord {
            namespace,
            component: component_of(Role::Aggregated),
            model,
            role: Role::Aggregated,
            instance_id: InstanceId::new(id),
            dp_size: 1,
            block_size,
            total_kv_blocks: 1000,
            request_plane,
            publisher_id: PublisherId::new(id.wrapping_add(1)),
            publisher_endpoint,
        }
    }
}

/// The fleet the router's own reducer makes of `records`, as if read from a store at time 0
/// (tests that need a [`FleetView`] without a store).
pub fn fleet_of(records: &[WorkerRecord<'_>]) -> Arc<FleetView> {
    let mut reducer = Reducer::new();
    for w in records {
        for (key, value) in w.all() {
            let ev = KvEvent::Put {
                key: key.as_bytes(),
                value: value.as_bytes(),
            };
            reducer.apply(ev, UnixMillis(0));
        }
    }
    reducer.materialize()
}

/// The component a role registers under in Dynamo 1.6.1.
pub fn component_of(role: Role) -> &'static str {
    match role {
        Role::Prefill => "prefill",
        _ => "backend",
    }
}

/// A JSON string literal.
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

impl WorkerRecord<'_> {
    /// `v1/instances/<ns>/<component>/generate/<hex id>` and its Endpoint value.
    pub fn endpoint(&self) -> (String, String) {
        let hex = self.instance_id.hex();
        let (ns, c) = (self.namespace, self.component);
        let transport = format!("{}/{hex}/{ns}/{c}/generate", self.request_plane);
        let value = format!(
            "{{\"type\":\"Endpoint\",\"component\":{},\"endpoint\":\"generate\",\"namespace\":{},\
             \"instance_id\":{},\"transport\":{{\"tcp\":{}}},\"device_type\":\"cuda\",\
             \"request_plane_codec\":\"msgpack\"}}",
            q(c),
            q(ns),
            self.instance_id.get(),
            q(&transport)
        );
        (format!("v1/instances/{ns}/{c}/generate/{hex}"), value)
    }

    /// `v1/mdc/<ns>/<component>/generate/<hex id>` and its Model value (the card).
    pub fn card(&self) -> (String, String) {
        let (worker_type, needs, model_type) = match self.role {
            Role::Prefill => ("prefill", "[[\"decode\"]]", ""),
            Role::Decode => ("decode", "[[\"prefill\"]]", "Chat | Completions"),
            _ => ("aggregated", "[]", "Chat | Completions"),
        };
        let hex = self.instance_id.hex();
        let (ns, c, m) = (self.namespace, self.component, q(self.model));
        let value = format!(
            "{{\"type\":\"Model\",\"namespace\":{},\"component\":{},\"endpoint\":\"generate\",\
             \"instance_id\":{},\"card_json\":{{\"display_name\":{m},\"slug\":{m},{TINY_MODEL},\
             \"architectural_max_context_length\":8192,\"context_length\":0,\
             \"kv_cache_block_size\":{},\"migration_limit\":0,\"model_type\":\"{model_type}\",\
             \"model_input\":\"Tokens\",\"worker_type\":\"{worker_type}\",\"needs\":{needs},\
             \"runtime_config\":{{\"context_length\":0,\"total_kv_blocks\":{},\"max_num_seqs\":256,\
             \"max_num_batched_tokens\":8192,\"tool_call_parser\":null,\"reasoning_parser\":null,\
             \"tool_call_arguments_format\":\"json_string\",\"structural_tag_mode\":\"off\",\
             \"structural_tag_scope\":\"auto\",\"structural_tag_schema\":\"auto\",\
             \"exclude_tools_when_tool_choice_none\":true,\"data_parallel_start_rank\":0,\
             \"data_parallel_size\":{},\"enable_local_indexer\":false,\
             \"kv_event_publishing_enabled\":false,\"runtime_data\":{{\"output_replay_consumer\":true}},\
             \"enable_eagle\":false}},\"media_decoder\":null,\"media_fetcher\":null}}}}",
            q(ns),
            q(c),
            self.instance_id.get(),
            self.block_size,
            self.total_kv_blocks,
            self.dp_size,
        );
        (format!("v1/mdc/{ns}/{c}/generate/{hex}"), value)
    }

    /// The `kv_metrics` EventChannel key and value.
    pub fn channel(&self) -> (String, String) {
        let (ns, c) = (self.namespace, self.component);
        let value = format!(
            "{{\"type\":\"EventChannel\",\"scope\":{{\"kind\":\"endpoint\",\"endpoint\":{{\
             \"namespace\":{},\"component\":{},\"name\":\"generate\"}}}},\"topic\":\"{KV_METRICS_TOPIC}\",\
             \"instance_id\":{},\"transport\":{{\"kind\":\"Zmq\",\"config\":{{\"endpoint\":{}}}}}}}",
            q(ns),
            q(c),
            self.publisher_id.get(),
            q(self.publisher_endpoint)
        );
        let key = channel_key(ns, c, "generate", KV_METRICS_TOPIC, self.publisher_id);
        (key, value)
    }

    /// All three records.
    pub fn all(&self) -> [(String, String); 3] {
        [self.endpoint(), self.card(), self.channel()]
    }
}

/// The card fields naming the tiny model's files (`shared/fixtures/tiny-model`), as captured.
const TINY_MODEL: &str = concat!(
    r#""source_path":"/models/tiny-model","#,
    r#""model_info":{"hf_config_json":{"path":"/models/tiny-model/config.json","#,
    r#""checksum":"blake3:6df25eca9f6263780db5e23d64c94853b5db9dd374fbe75811f7db13dc4c9104","size":411}},"#,
    r#""tokenizer":{"hf_tokenizer_json":{"path":"/models/tiny-model/tokenizer.json","#,
    r#""checksum":"blake3:a7bb92ed896079ec4872a416916bf7910d50feb8ca39ddeaaf54ae107843c6bb","size":258310}},"#,
    r#""prompt_formatter":{"hf_tokenizer_config_json":{"path":"/models/tiny-model/tokenizer_config.json","#,
    r#""checksum":"blake3:52ee138fd0408ba7ae1c04fe5cc7442814568aea496215cdf68dd24176201cee","size":1243}},"#,
    r#""gen_config":{"hf_generation_config_json":{"path":"/models/tiny-model/generation_config.json","#,
    r#""checksum":"blake3:bc73f45a92f02980ecd448fd66d04a518de67b5076c7f3fe8d45c703c5ef3d8a","size":54}}"#
);

/// Dynamo's `Key::url_safe`: every non-alphanumeric byte as `%XX`.
pub fn url_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(char::from(b));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

/// The file holding `key` (`v1/<bucket>/<rest>`) under `root`; `None` for a key without a bucket.
pub fn file_path(root: &Path, key: &str) -> Option<PathBuf> {
    let mut parts = key.splitn(3, '/');
    let (v1, bucket, rest) = (parts.next()?, parts.next()?, parts.next()?);
    if v1.is_empty() || bucket.is_empty() || rest.is_empty() {
        return None;
    }
    Some(root.join(v1).join(bucket).join(url_safe(rest)))
}

/// A card's JSON tree, for tests.
pub fn card_value(record: &str) -> Option<Value> {
    serde_json::from_str::<Value>(record)
        .ok()
        .and_then(|v| v.get("card_json").cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_url_safe() {
        let root = Path::new("/r");
        assert_eq!(
            file_path(root, "v1/instances/agg/backend/generate/6a6ca22d4998ac0b").unwrap(),
            Path::new("/r/v1/instances/agg%2Fbackend%2Fgenerate%2F6a6ca22d4998ac0b")
        );
        assert_eq!(
            url_safe("namespace/a.b/topic/kv_metrics"),
            "namespace%2Fa%2Eb%2Ftopic%2Fkv%5Fmetrics"
        );
        assert_eq!(file_path(root, "v1/instances"), None);
    }

    /// The real 1.6.1 dump, key line then value line.
    fn fixture() -> Vec<(String, String)> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/dynamo-1.6.1/etcd-dump.txt"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("fixture {path}: {e}"));
        let lines: Vec<&str> = text.lines().collect();
        lines
            .chunks(2)
            .map(|kv| (kv[0].to_owned(), kv[1].to_owned()))
            .collect()
    }

    fn captured(key: &str) -> String {
        fixture()
            .into_iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("{key} not in the dump"))
            .1
    }

    /// Our records for the captured workers are the captured records byte for byte, except that
    /// the simulator says it publishes no kv-events.
    #[test]
    fn records_are_the_captured_1_6_1_records() {
        let no_kv_events = |v: String| {
            v.replace(
                r#""enable_local_indexer":true,"kv_event_publishing_enabled":true"#,
                r#""enable_local_indexer":false,"kv_event_publishing_enabled":false"#,
            )
        };
        // (namespace, component, model, role, id, request plane, kv_metrics publisher, its port)
        let workers = [
            (
                "agg",
                "tiny-agg",
                Role::Aggregated,
                0x6a6c_a22d_4998_ac0b,
                "127.0.0.1:35917",
                5_877_256_929_325_844,
                44339,
            ),
            (
                "disagg",
                "tiny-disagg",
                Role::Decode,
                0x6a6c_a22d_4998_ac09,
                "127.0.0.1:43657",
                3_247_520_753_343_601,
                43617,
            ),
            (
                "disagg",
                "tiny-disagg",
                Role::Prefill,
                0x6a6c_a22d_4998_ac07,
                "127.0.0.1:36297",
                823_171_684_543_259,
                33341,
            ),
        ];
        for (ns, model, role, id, plane, publisher, port) in workers {
            let endpoint = format!("tcp://127.0.0.1:{port}");
            let r = WorkerRecord {
                namespace: ns,
                component: component_of(role),
                model,
                role,
                instance_id: InstanceId::new(id),
                dp_size: 1,
                block_size: 64,
                total_kv_blocks: 16_384,
                request_plane: plane,
                publisher_id: PublisherId::new(publisher),
                publisher_endpoint: &endpoint,
            };
            for (key, value) in r.all() {
                assert_eq!(value, no_kv_events(captured(&key)), "{key}");
            }
        }
    }

    #[test]
    fn names_are_escaped() {
        let r = WorkerRecord {
            namespace: "ns",
            component: "backend",
            model: "a \"quoted\" model",
            role: Role::Aggregated,
            instance_id: InstanceId::new(1),
            dp_size: 2,
            block_size: 16,
            total_kv_blocks: 10,
            request_plane: "127.0.0.1:1",
            publisher_id: PublisherId::new(2),
            publisher_endpoint: "tcp://127.0.0.1:2",
        };
        for (_, v) in r.all() {
            serde_json::from_str::<Value>(&v).unwrap();
        }
        let card = card_value(&r.card().1).unwrap();
        assert_eq!(card["display_name"], "a \"quoted\" model");
        assert_eq!(card["runtime_config"]["data_parallel_size"], 2);
    }
}
