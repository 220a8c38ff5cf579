//! Software prefetch: ask the CPU to start loading memory that is about to be used.
//!
//! With a thousand streams on a worker, a stream's state has left the caches by the time
//! its next event comes (the kernel's work for the other streams' reads and writes sees
//! to that), and each of its cache lines is a wait on memory when the event is observed.
//! The relay lists that state before it waits for the next event ([`for_next_poll`]), and
//! the task's outermost future fetches it as the poll starts ([`TaskLines`]), so the
//! waits overlap instead of following each other. A hint only: it never changes what a
//! program computes, and it is a no-op where the target has no such instruction.

use std::cell::RefCell;

/// The cache line size the lines are counted in.
pub const LINE: usize = 64;

/// The most lines one list holds: what a streamed event's state spans, 26 for an OpenAI
/// chat stream over the relay with the live view on (a test in `observe` keeps it within).
pub const CAPACITY: usize = 32;

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

    /// Add every cache line `value` lies in, as many as there is room for. It runs per
    /// event, so it is a plain loop: with `(first..=last).step_by(LINE)`, and the list
    /// returned by value through each layer, listing cost ~460 instructions per event in
    /// a whole process (`budget.sh --process`), now ~210.
    pub fn value<T: ?Sized>(&mut self, value: &T) {
        let len = std::mem::size_of_val(value);
        if len == 0 {
            return;
        }
        let start = std::ptr::from_ref(value).cast::<u8>() as usize;
        // A value lies inside the address space, so its end does not wrap.
        let end = start.saturating_add(len);
        let mut line = start & !(LINE - 1);
        while line < end && self.push(line) {
            line += LINE;
        }
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

thread_local! {
    /// What the task being polled lists for its next poll. Const-initialised: reaching
    /// it is a plain thread-local access, with no first-use check.
    static NEXT: RefCell<Lines> = const { RefCell::new(Lines::EMPTY) };
}

/// List, for the task being polled, the lines its next poll will want first: called just
/// before it waits. A task whose outermost future is not a [`TaskLines`] lists for
/// nothing (the next poll of a task that is clears the list first).
pub fn for_next_poll(list: impl FnOnce(&mut Lines)) {
    let _ = NEXT.try_with(|next| {
        if let Ok(mut next) = next.try_borrow_mut() {
            list(&mut next);
        }
    });
}

/// A task's list, kept in its outermost future between two polls.
///
/// A task's state lies in several futures nested inside each other, and a poll reads
/// each level's state before it knows which level to go down to: with many tasks, each
/// of those reads is a wait on memory, one after another. The poll's first step fetches
/// what the last poll listed ([`for_next_poll`]), so that the levels' lines and the
/// state the innermost one then works on come in together.
#[derive(Debug, Default)]
pub struct TaskLines(Lines);

impl TaskLines {
    /// Fetch what the last poll listed, then run this one, keeping what it lists.
    #[inline]
    pub fn around<R>(&mut self, poll: impl FnOnce() -> R) -> R {
        self.0.fetch();
        let _ = NEXT.try_with(|next| {
            if let Ok(mut next) = next.try_borrow_mut() {
                next.len = 0;
            }
        });
        let polled = poll();
        let _ = NEXT.try_with(|next| {
            if let Ok(next) = next.try_borrow() {
                self.0 = *next;
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
    fn a_task_keeps_what_its_poll_listed_and_only_that() {
        let state = Aligned([0; 130]);
        let mut task = TaskLines::default();
        task.around(|| for_next_poll(|lines| lines.value(&state.0[..8])));
        assert_eq!(task.listed().len(), 1, "what the poll listed is kept");
        assert!(task.listed().holds(&state.0[0]));
        // The next poll lists something else: the first list is not carried over.
        task.around(|| for_next_poll(|lines| lines.value(&state.0[64..72])));
        assert_eq!(task.listed().len(), 1);
        assert!(task.listed().holds(&state.0[64]) && !task.listed().holds(&state.0[0]));
        // A poll that lists nothing leaves nothing, nor does another task's list leak in.
        let mut other = TaskLines::default();
        other.around(|| for_next_poll(|lines| lines.value(&state)));
        assert_eq!(other.listed().len(), 3);
        task.around(|| ());
        assert!(task.listed().is_empty());
        // Listing outside any task's poll is harmless, and the next poll starts empty.
        for_next_poll(|lines| lines.value(&state));
        task.around(|| ());
        assert!(task.listed().is_empty());
    }
}
