//! Reading fuzzer bytes as a stream of small decisions.

/// Reads fuzzer bytes as a stream of small decisions; zeros once exhausted.
pub(super) struct Input<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Input<'a> {
    pub(super) fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub(super) fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            usize::from(self.byte()) % n
        }
    }

    /// Up to `max` raw bytes from the input.
    pub(super) fn bytes(&mut self, max: usize) -> &'a [u8] {
        let len = self.below(max + 1);
        let start = self.pos.min(self.data.len());
        let end = (start + len).min(self.data.len());
        self.pos = end;
        &self.data[start..end]
    }

    /// Up to `max` raw bytes as one unterminated line without quotes: garbage that can never
    /// be a JSON object with keys, so never a message an oracle would have to follow.
    pub(super) fn garbage_line(&mut self, max: usize) -> Vec<u8> {
        self.bytes(max)
            .iter()
            .map(|b| if *b == b'"' { b'\'' } else { *b })
            .filter(|b| *b != b'\n')
            .collect()
    }
}
