//! The event bus listener's families on `/metrics`: `continuum_dynamo_event_bus_sessions`,
//! `continuum_dynamo_event_bus_stream_bytes_total{direction}` and
//! `continuum_dynamo_event_bus_refusals_total{code}`, whose `code` is the contract's closed set
//! of refusal and close codes (no stream, session, broker or client string, BUS-37). Rendered in
//! every build: zeros where no listener runs.

use std::fmt::Write as _;

use continuum_core::bus::metrics::BusMetrics;

pub(super) fn render(out: &mut String, bus: &BusMetrics) {
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_event_bus_sessions Active event bus sessions (brokers and kv_listeners).\n\
         # TYPE continuum_dynamo_event_bus_sessions gauge\n\
         continuum_dynamo_event_bus_sessions {}",
        bus.sessions().max(0)
    );
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_event_bus_refusals_total Event bus refusals and closes, by code.\n\
         # TYPE continuum_dynamo_event_bus_refusals_total counter"
    );
    for (code, n) in bus.each_refusal() {
        let _ = writeln!(
            out,
            "continuum_dynamo_event_bus_refusals_total{{code=\"{code}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_event_bus_stream_bytes_total Data-stream bytes relayed, by direction (in: from brokers).\n\
         # TYPE continuum_dynamo_event_bus_stream_bytes_total counter\n\
         continuum_dynamo_event_bus_stream_bytes_total{{direction=\"in\"}} {}\n\
         continuum_dynamo_event_bus_stream_bytes_total{{direction=\"out\"}} {}",
        bus.stream_bytes_in(),
        bus.stream_bytes_out()
    );
}

#[cfg(test)]
mod tests {
    use continuum_core::bus::metrics::BusMetrics;
    use continuum_event_bus::code::Code;

    #[test]
    fn every_code_is_a_series_and_counts_land_on_their_own() {
        let m = BusMetrics::default();
        m.refused(Code::Forbidden);
        m.refused(Code::Forbidden);
        m.session_opened();
        let mut out = String::new();
        super::render(&mut out, &m);
        assert!(out.contains("continuum_dynamo_event_bus_sessions 1\n"));
        assert!(out.contains("continuum_dynamo_event_bus_refusals_total{code=\"forbidden\"} 2\n"));
        assert!(
            out.contains("continuum_dynamo_event_bus_refusals_total{code=\"tls_required\"} 0\n")
        );
        assert_eq!(
            out.matches("continuum_dynamo_event_bus_refusals_total{")
                .count(),
            Code::ALL.len()
        );
    }
}
