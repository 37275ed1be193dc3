//! One time budget per request: a tower layer around every service (gRPC and the JSON
//! gateway) that runs each call inside [`kine_core::metered::request`], so that the datastore
//! operations one request makes share `--request-timeout` instead of each getting all of it.
//! A streaming RPC's budget covers its handler only; its stream runs on its own bounds.

use std::cell::Cell;
use std::task::{Context, Poll};
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

#[derive(Clone, Copy, Default)]
pub struct RequestBudgetLayer;

impl<S> tower_layer::Layer<S> for RequestBudgetLayer {
    type Service = RequestBudget<S>;
    fn layer(&self, inner: S) -> RequestBudget<S> {
        RequestBudget { inner }
    }
}

#[derive(Clone)]
pub struct RequestBudget<S> {
    inner: S,
}

impl<S: tower_service::Service<R>, R> tower_service::Service<R> for RequestBudget<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = TaskLocalFuture<Cell<Instant>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        kine_core::metered::request(self.inner.call(req))
    }
}
