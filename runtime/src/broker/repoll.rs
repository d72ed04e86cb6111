//! A task wrapper that absorbs the wake-ups a task gives itself while it runs.
//!
//! A hyper connection wakes its own task in the middle of a poll: the request body's channels
//! signal the dispatcher, which shares the task with the handler reading the body. Tokio's
//! multi-thread scheduler takes a task woken during its own poll for a task that yielded: it
//! queues it behind the others and wakes a parked worker to steal it. That is a futex wake of
//! another thread on every request (on a VM whose idle CPUs halt, an interrupt to the other
//! CPU and a VM exit), paid before the next task on this worker runs — with a push, the live
//! stream that carries it out. [`Repoll`] polls again at once instead, [`REPOLLS`] times at
//! most, so the task goes back to the scheduler only when something else woke it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// Polls in a row within one turn of the task; past that a self-wake goes to the scheduler
/// (whatever keeps waking itself still lets the others run).
const REPOLLS: usize = 4;

/// `inner`, polled again at once when it woke itself while being polled.
pub(super) struct Repoll<F> {
    inner: Pin<Box<F>>,
    shared: Arc<Shared>,
    waker: Waker,
}

struct Shared {
    /// The wrapped future is being polled: a wake now is noted, not passed on.
    polling: AtomicBool,
    /// It was woken during the poll.
    woken: AtomicBool,
    /// The task's own waker, from its latest poll.
    task: TaskWaker,
}

/// A task's waker as of its latest poll, for a wake that comes from elsewhere.
#[derive(Default)]
struct TaskWaker(Mutex<Option<Waker>>);

impl TaskWaker {
    /// Keeps `waker` (unless the one kept already wakes the same task).
    fn set(&self, waker: &Waker) {
        let mut task = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !task.as_ref().is_some_and(|t| t.will_wake(waker)) {
            *task = Some(waker.clone());
        }
    }

    /// Wakes the task, if it was ever polled.
    fn wake(&self) {
        let task = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Noted while the poll runs, re-checked after: a poll that ended in between has
        // either seen the note (and polls again) or ended before it (the task is woken).
        if self.polling.load(SeqCst) {
            self.woken.store(true, SeqCst);
            if self.polling.load(SeqCst) {
                return;
            }
        }
        self.task.wake();
    }
}

impl<F: Future> Repoll<F> {
    pub(super) fn new(inner: F) -> Self {
        let shared = Arc::new(Shared {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: TaskWaker::default(),
        });
        let waker = Waker::from(Arc::clone(&shared));
        Repoll {
            inner: Box::pin(inner),
            shared,
            waker,
        }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.shared.task.set(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..REPOLLS {
            this.shared.woken.store(false, SeqCst);
            this.shared.polling.store(true, SeqCst);
            let poll = this.inner.as_mut().poll(&mut inner_cx);
            this.shared.polling.store(false, SeqCst);
            if poll.is_ready() || !this.shared.woken.swap(false, SeqCst) {
                return poll;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Lets the tasks queued on this worker run before the caller goes on.
///
/// `tokio::task::yield_now` alone does not survive [`Repoll`]: when something else woke the
/// task during the same poll, the wrapper polls again at once and the yield, polled a second
/// time, is over before anything else ran. This one is over only once the scheduler has woken
/// it, which it does after running what was queued on the worker (or at once outside a runtime).
pub(super) async fn yield_to_queued() {
    /// Set by the scheduler's wake; then wakes the task.
    #[derive(Default)]
    struct Turn {
        came: AtomicBool,
        task: TaskWaker,
    }
    impl Wake for Turn {
        fn wake(self: Arc<Self>) {
            self.came.store(true, SeqCst);
            self.task.wake();
        }
    }
    let turn = Arc::new(Turn::default());
    let mut yielded = std::pin::pin!(tokio::task::yield_now());
    let mut asked = false;
    std::future::poll_fn(|cx| {
        turn.task.set(cx.waker());
        if !asked {
            asked = true;
            // The scheduler keeps this waker until the worker has nothing else queued.
            let waker = Waker::from(Arc::clone(&turn));
            if yielded
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready()
            {
                return Poll::Ready(());
            }
        }
        if turn.came.load(SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wake-ups that reach the task.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        (count, waker)
    }

    /// Wakes itself `times` times, then is ready with how often it was polled.
    fn waking_itself(times: usize) -> impl Future<Output = usize> {
        let mut polls = 0;
        std::future::poll_fn(move |cx| {
            polls += 1;
            if polls > times {
                return Poll::Ready(polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
    }

    #[test]
    fn a_self_wake_is_polled_again_without_waking_the_task() {
        let (count, waker) = task();
        let mut f = Repoll::new(waking_itself(2));
        let got = Pin::new(&mut f).poll(&mut Context::from_waker(&waker));
        assert_eq!(got, Poll::Ready(3));
        assert_eq!(count.0.load(SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_goes_back_to_the_scheduler() {
        let (count, waker) = task();
        let mut f = Repoll::new(waking_itself(REPOLLS + 1));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(Pin::new(&mut f).poll(&mut cx), Poll::Pending);
        assert_eq!(
            count.0.load(SeqCst),
            1,
            "the task is woken to run again later"
        );
        assert_eq!(Pin::new(&mut f).poll(&mut cx), Poll::Ready(REPOLLS + 2));
    }

    #[test]
    fn a_wake_from_outside_reaches_the_latest_task() {
        let (first, first_waker) = task();
        let (second, second_waker) = task();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<u8>();
        let mut f = Repoll::new(std::future::poll_fn(move |cx| {
            Pin::new(&mut rx).poll(cx).map(Result::ok)
        }));
        assert!(
            Pin::new(&mut f)
                .poll(&mut Context::from_waker(&first_waker))
                .is_pending()
        );
        assert!(
            Pin::new(&mut f)
                .poll(&mut Context::from_waker(&second_waker))
                .is_pending()
        );
        tx.send(7).unwrap();
        assert_eq!((first.0.load(SeqCst), second.0.load(SeqCst)), (0, 1));
        let got = Pin::new(&mut f).poll(&mut Context::from_waker(&second_waker));
        assert_eq!(got, Poll::Ready(Some(7)));
    }
    /// Runs `yield_once` inside a [`Repoll`] whose task also wakes itself in the same poll (as a
    /// hyper connection does); tells whether a task queued just before had run when it was over.
    fn queued_task_ran_before<Y: Future<Output = ()> + Send + 'static>(
        yield_once: impl FnOnce() -> Y + Send + 'static,
    ) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            tokio::spawn(Repoll::new(async move {
                let ran = Arc::new(AtomicBool::new(false));
                let other = Arc::clone(&ran);
                tokio::spawn(async move { other.store(true, SeqCst) });
                let mut woke_itself = false;
                std::future::poll_fn(|cx| {
                    if !woke_itself {
                        woke_itself = true;
                        cx.waker().wake_by_ref();
                    }
                    Poll::Ready(())
                })
                .await;
                yield_once().await;
                ran.load(SeqCst)
            }))
            .await
            .unwrap()
        })
    }

    #[test]
    fn a_yield_to_queued_tasks_lets_them_run_first_even_when_repolled() {
        assert!(queued_task_ran_before(yield_to_queued));
        // What it guards against: the plain yield, polled again by the wrapper, is over at once.
        assert!(!queued_task_ran_before(tokio::task::yield_now));
    }
}
