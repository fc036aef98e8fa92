// The task the whole-history client scripts run (ai_sdk_loops.mjs,
// agents_js_loops.mjs): a coding agent with one function tool, asked two
// questions in one conversation. Its instructions are long, as an agent's are
// (some thousands of tokens), so that the part of each request the server has
// already seen is the bulk of it: what prefix reuse is measured on.

export const QUESTIONS = ['Find the bug in app.py.', 'Now fix it.'];

const RULES = [
  'Read a file before you change it, and read the tests that cover it.',
  'Keep each change small enough to review in one sitting.',
  'Name things after what they are in the domain, never after their type.',
  'Never swallow an exception; convert it once, at the boundary, with its cause.',
  'A test that cannot fail is a defect: assert what the change is for.',
  'Prefer the standard library to a new dependency.',
  'Say what happens to the state when a function raises.',
  'Leave the code you touch a little clearer than you found it.',
];

// Twenty-five numbered sections of house rules: some thousands of tokens.
export const INSTRUCTIONS = [
  'You are a careful coding agent working in a Python repository.',
  ...Array.from({ length: 25 }, (_, section) =>
    `Section ${section + 1}. ${RULES.map((rule, i) => `(${i + 1}) ${rule}`).join(' ')}`),
].join('\n');

export const TOOL_NAME = 'read_file';
export const TOOL_DESCRIPTION = 'Read a file of the repository.';

// What the k-th call of the tool (1, 2, ...) reads: short enough that the
// model's answer quotes it whole.
export function fileContents(k) {
  return `def add(a, b): return a - b  # ${k}`;
}
