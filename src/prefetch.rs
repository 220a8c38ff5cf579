//! Software prefetch: ask the CPU to start loading memory that is about to be used.
//!
//! With many streams on a worker, a stream's state has left the caches by the time its
//! next event comes (the kernel's work for the other streams' reads and writes sees to
//! that, at 100 streams too), and each of its cache lines is a wait on memory when the
//! event is observed. The relay lists that state before it waits for the next event
//! ([`for_next_poll`]), and the task's outermost future keeps the list and fetches it as
//! each poll starts ([`TaskLines`]), so the waits overlap instead of following each other.
//! What a stream's events touch stays where it is from one event to the next, so the
//! list is built anew only now and then ([`REFRESH_EVERY`]), not per event. A hint only:
//! it never changes what a program computes, and it is a no-op where the target has no
//! such instruction.

use std::cell::{Cell, RefCell};

/// The cache line size the lines are counted in.
pub const LINE: usize = 64;

/// The most lines one list holds: what a streamed event's state spans, 26 for an OpenAI
/// chat stream over the relay with the live view on (a test in `observe` keeps it within).
pub const CAPACITY: usize = 32;

/// A list outlives this many waits at most: whoever lists memory that moves as events
/// come (the clock's next slot) lists what the next this many events touch.
pub const REFRESH_EVERY: usize = 8;

/// Addresses to prefetch later, kept as plain numbers: taken from state before an
/// `await`, fetched after it. An address that went stale meanwhile costs a wasted hint,
/// nothing else, since a prefetch reads nothing the program sees.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lines {
    at: [usize; CAPACITY],
    len: usize,
}

impl Lines {
    const EMPTY: Lines = Lines {
        at: [0; CAPACITY],
        len: 0,
    };

    /// Add the cache line holding `address` (not dereferenced); past the capacity, none.
    pub fn address<T>(&mut self, address: *const T) {
        self.push(address as usize);
    }

    /// List `address`; false when the list is full (and it is not listed).
    fn push(&mut self, address: usize) -> bool {
        let Some(slot) = self.at.get_mut(self.len) else {
            return false;
        };
        *slot = address;
        self.len += 1;
        true
    }

    /// Add every cache line `value` lies in, as many as there is room for.
    pub fn value<T: ?Sized>(&mut self, value: &T) {
        self.bytes(
            std::ptr::from_ref(value).cast::<u8>() as usize,
            std::mem::size_of_val(value),
        );
    }

    fn bytes(&mut self, start: usize, len: usize) {
        if len == 0 {
            return;
        }
        // Memory lies inside the address space, so its end does not wrap.
        let end = start.saturating_add(len);
        let mut line = start & !(LINE - 1);
        while line < end && self.push(line) {
            line = line.saturating_add(LINE);
        }
    }

    /// Add every cache line `count` values of `T` from `first` lie in (not dereferenced:
    /// for room that is allocated but not written yet), as many as there is room for.
    pub fn span<T>(&mut self, first: *const T, count: usize) {
        self.bytes(
            first as usize,
            count.saturating_mul(std::mem::size_of::<T>()),
        );
    }

    /// How many lines are listed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the line holding `address` is listed.
    #[cfg(test)]
    pub fn holds<T: ?Sized>(&self, address: *const T) -> bool {
        let line = address.cast::<u8>() as usize & !(LINE - 1);
        self.at[..self.len]
            .iter()
            .any(|&at| at & !(LINE - 1) == line)
    }

    /// Start loading every listed line.
    pub fn fetch(&self) {
        for &address in &self.at[..self.len] {
            prefetch(address);
        }
    }
}

/// What the task being polled lists for its next poll, if it lists anything.
struct Next {
    listed: Cell<bool>,
    lines: RefCell<Lines>,
}

thread_local! {
    /// Const-initialised: reaching it is a plain thread-local access, with no first-use
    /// check.
    static NEXT: Next = const {
        Next {
            listed: Cell::new(false),
            lines: RefCell::new(Lines::EMPTY),
        }
    };
}

/// List anew, for the task being polled, the lines its polls will want first: called
/// just before it waits. The task keeps the list, and fetches it as each poll starts,
/// until it lists again (when [`Refresh::due`] says so while what it lists moves;
/// [`forget`] when it is done with that memory). A task whose outermost future is not a
/// [`TaskLines`] lists for nothing.
pub fn for_next_poll(list: impl FnOnce(&mut Lines)) {
    let _ = NEXT.try_with(|next| {
        if let Ok(mut lines) = next.lines.try_borrow_mut() {
            lines.len = 0;
            list(&mut lines);
            next.listed.set(true);
        }
    });
}

/// The task being polled is done with the memory it listed: its polls fetch nothing until
/// it lists again.
pub fn forget() {
    for_next_poll(|_| ());
}

/// When a lister lists again: at its first wait, when the shape of what it lists changes
/// (`shape`, e.g. whether an observer is there yet), and every [`REFRESH_EVERY`] waits.
#[derive(Debug, Default)]
pub struct Refresh {
    waits_left: usize,
    shape: bool,
}

impl Refresh {
    /// Called once per wait: whether to list before this one.
    pub fn due(&mut self, shape: bool) -> bool {
        let due = self.waits_left == 0 || shape != self.shape;
        if due {
            self.waits_left = REFRESH_EVERY;
            self.shape = shape;
        }
        self.waits_left = self.waits_left.saturating_sub(1);
        due
    }
}

/// A task's list, kept in its outermost future between polls.
///
/// A task's state lies in several futures nested inside each other, and a poll reads
/// each level's state before it knows which level to go down to: with many tasks, each
/// of those reads is a wait on memory, one after another. The poll's first step fetches
/// what the task listed ([`for_next_poll`]), so that the levels' lines and the state the
/// innermost one then works on come in together.
#[derive(Debug, Default)]
pub struct TaskLines(Lines);

impl TaskLines {
    /// Fetch the task's list, then run this poll, keeping what it lists instead if it
    /// lists anything.
    #[inline]
    pub fn around<R>(&mut self, poll: impl FnOnce() -> R) -> R {
        self.0.fetch();
        let _ = NEXT.try_with(|next| next.listed.set(false));
        let polled = poll();
        let _ = NEXT.try_with(|next| {
            if next.listed.get() {
                if let Ok(lines) = next.lines.try_borrow() {
                    self.0 = *lines;
                }
            }
        });
        polled
    }

    /// The lines the last poll listed.
    #[cfg(test)]
    pub fn listed(&self) -> &Lines {
        &self.0
    }
}

#[inline]
fn prefetch(address: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that does not access memory architecturally: it
    // cannot fault or read anything the program sees, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(address as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(align(64))]
    struct Aligned([u8; 130]);

    #[test]
    fn a_value_is_listed_by_the_lines_it_lies_in_and_the_list_is_bounded() {
        let aligned = Aligned([0; 130]);
        let mut lines = Lines::default();
        lines.value(&aligned);
        assert_eq!(lines.len(), 3, "192 bytes from a line's start");
        let mut lines = Lines::default();
        lines.value(&aligned.0[63..65]);
        assert_eq!(lines.len(), 2, "two bytes across a line's end");
        lines.value(&aligned.0[..0]);
        assert_eq!(lines.len(), 2, "nothing for nothing");
        lines.value(&[0u64; 400]);
        assert_eq!(lines.len(), CAPACITY, "capped");
        lines.fetch();
        // A dangling address is a hint like any other.
        let mut stale = Lines::default();
        stale.address(std::ptr::dangling::<u8>());
        stale.fetch();
    }

    #[test]
    fn a_task_keeps_what_it_listed_last_and_only_that() {
        let state = Aligned([0; 130]);
        let mut task = TaskLines::default();
        task.around(|| for_next_poll(|lines| lines.value(&state.0[..8])));
        assert_eq!(task.listed().len(), 1, "what the poll listed is kept");
        assert!(task.listed().holds(&state.0[0]));
        // A poll that lists nothing keeps the list.
        task.around(|| ());
        assert!(task.listed().holds(&state.0[0]));
        // One that lists something else replaces it: the first list is not carried over.
        task.around(|| for_next_poll(|lines| lines.value(&state.0[64..72])));
        assert_eq!(task.listed().len(), 1);
        assert!(task.listed().holds(&state.0[64]) && !task.listed().holds(&state.0[0]));
        // Another task's list does not leak into it.
        let mut other = TaskLines::default();
        other.around(|| for_next_poll(|lines| lines.value(&state)));
        assert_eq!(other.listed().len(), 3);
        task.around(|| ());
        assert_eq!(task.listed().len(), 1);
        // Nor does a list made outside any task's poll.
        for_next_poll(|lines| lines.value(&state));
        task.around(|| ());
        assert_eq!(task.listed().len(), 1);
        // Forgetting empties it.
        task.around(forget);
        assert!(task.listed().is_empty());
    }

    #[test]
    fn a_list_is_due_first_then_every_refresh_or_when_its_shape_changes() {
        let mut refresh = Refresh::default();
        let dues =
            |refresh: &mut Refresh, shape, waits| (0..waits).filter(|_| refresh.due(shape)).count();
        assert!(refresh.due(false), "the first wait lists");
        assert_eq!(dues(&mut refresh, false, REFRESH_EVERY - 1), 0);
        assert!(refresh.due(false), "and every REFRESH_EVERY waits");
        assert!(refresh.due(true), "and when the shape changes");
        assert_eq!(dues(&mut refresh, true, REFRESH_EVERY - 1), 0);
        assert_eq!(dues(&mut refresh, true, 3 * REFRESH_EVERY), 3);
    }

    #[test]
    fn a_span_is_listed_by_its_lines_without_being_read() {
        let aligned = Aligned([0; 130]);
        let first = std::ptr::from_ref(&aligned.0[60]).cast::<u64>();
        let mut lines = Lines::default();
        lines.span(first, 2);
        assert_eq!(lines.len(), 2, "16 bytes from byte 60 lie in two lines");
        lines.span(first, 0);
        assert_eq!(lines.len(), 2, "nothing for nothing");
        lines.span(std::ptr::dangling::<u64>(), usize::MAX);
        assert_eq!(
            lines.len(),
            CAPACITY,
            "a huge span is capped, not overflowed"
        );
    }
}
