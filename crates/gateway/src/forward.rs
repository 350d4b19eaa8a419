//! Internal calls between servers (Nightcore §3.2): an engine whose caller
//! calls a function it does not run sends the call up its link to this
//! gateway (a `Forward` frame); the gateway sends it on to a ready engine
//! that runs the function, under a call id of its own, and answers the
//! caller's engine under the caller's id. The call keeps its caller's ids
//! (which the callee's engine shows in traces) and what was left of its
//! deadline.
//!
//! A forward is hostile until checked, like any frame from an engine: its
//! name, its size and its count are checked here again.

use crate::engine_link::{Forwarded, Reply};
use crate::{GwShared, ThreadState};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use wire::frame::Timing;
use wire::ErrorKind;

pub(crate) async fn run(sh: Arc<GwShared>, th: Rc<ThreadState>, f: Forwarded) {
    let reply = send_on(&sh, &th, &f).await;
    f.from.answer(f.header.call_id, reply);
    f.from.forwards_waiting.set(f.from.forwards_waiting.get().saturating_sub(1));
}

async fn send_on(sh: &GwShared, th: &ThreadState, f: &Forwarded) -> Reply {
    let err = |kind, msg: String| Reply::Err(kind, msg, Timing::default());
    let Some(mut parts) = wire::frame::forward_parts(&f.header, &f.body) else {
        return err(ErrorKind::BadRequest, format!("a Forward frame of {} bytes is malformed", f.body.len()));
    };
    // A trace block is passed on only if it decodes (a valid context and
    // state), as a header would be.
    if !parts.trace.is_empty() && api::trace::TraceContext::decode(parts.trace).is_none() {
        parts.trace = &[];
    }
    let name = match std::str::from_utf8(parts.name) {
        Ok(n) if wire::valid_function_name(n) => n,
        _ => return err(ErrorKind::NotFound, format!("no function named {:?}", String::from_utf8_lossy(parts.name))),
    };
    let max = sh.cfg.payload_len_max;
    if parts.input.len() > max {
        let msg = format!("input of {} bytes exceeds the {max}-byte limit", parts.input.len());
        return err(ErrorKind::PayloadTooLarge, msg);
    }
    let from = th.engine_of(&f.from);
    if let Some(e) = &from {
        e.forwarded.fetch_add(1, Ordering::Relaxed);
    }
    let hop = th.next_call_id();
    let (timeout_ms, depth) = (f.header.call_timeout_ms(), f.header.forward_depth());
    let sent = th
        .send_call(sh, name, (from.as_ref(), timeout_ms), |to, left_ms| async move {
            to.link.forward(hop, left_ms, depth, &parts).await
        })
        .await;
    match sent {
        Some((Reply::Unsent, _)) => err(
            ErrorKind::EngineUnavailable,
            format!("the links to the engines running {name} failed before the call was sent; retry shortly"),
        ),
        Some((reply, _)) => reply,
        None => match sh.store.get(name) {
            Ok(Some(_)) => err(
                ErrorKind::EngineUnavailable,
                format!("{name} runs on no other engine that is ready now (see staccato engines); retry shortly"),
            ),
            _ => err(ErrorKind::NotFound, format!("no function named {name:?}")),
        },
    }
}
