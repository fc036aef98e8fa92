// The Cline CLI against the server, through its Agent Client Protocol mode
// (`cline --acp`: JSON-RPC 2.0 over stdio, one message a line), the way an
// editor holds a conversation with it: one session, one prompt per user turn,
// each tool call allowed once when Cline asks. Cline is set up beforehand
// (`cline auth`, its openai-native provider on the server's /v1);
// tests/clients/test_cline.py does that and reads the one JSON line printed.
//
//   node cline_acp.mjs CLINE CWD QUESTION...
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

const [cline, cwd, ...questions] = process.argv.slice(2);
const agent = spawn(cline, ['--acp'], { cwd, stdio: ['pipe', 'pipe', 'pipe'] });
let stderr = '';
agent.stderr.on('data', (chunk) => { stderr += chunk; });

let nextId = 1;
const pending = new Map();
let turn; // what the running prompt has produced
let permissions = 0;

function send(message) {
  agent.stdin.write(`${JSON.stringify({ jsonrpc: '2.0', ...message })}\n`);
}

function call(method, params) {
  const id = nextId++;
  send({ id, method, params });
  return new Promise((resolve, reject) => pending.set(id, { method, resolve, reject }));
}

function onUpdate({ update }) {
  if (update.sessionUpdate === 'agent_message_chunk' && update.content.type === 'text') {
    turn.text += update.content.text;
  } else if (update.sessionUpdate === 'tool_call_update' && update.status === 'completed') {
    turn.tool_calls.push({ call_id: update.toolCallId, output: update.rawOutput });
  }
}

createInterface({ input: agent.stdout }).on('line', (line) => {
  const message = JSON.parse(line);
  if (message.method === 'session/request_permission') {
    permissions += 1;
    const allow = message.params.options.find((option) => option.kind === 'allow_once');
    send({ id: message.id, result: { outcome: { outcome: 'selected', optionId: allow.optionId } } });
  } else if (message.method === 'session/update') {
    onUpdate(message.params);
  } else if (message.method !== undefined) {
    send({ id: message.id, error: { code: -32601, message: `${message.method} is not offered` } });
  } else {
    const { method, resolve, reject } = pending.get(message.id);
    pending.delete(message.id);
    if (message.error) reject(new Error(`${method}: ${JSON.stringify(message.error)}`));
    else resolve(message.result);
  }
});
agent.on('exit', (code) => {
  for (const { method, reject } of pending.values()) {
    reject(new Error(`cline exited (${code}) during ${method}: ${stderr.slice(-2000)}`));
  }
});

await call('initialize', {
  protocolVersion: 1,
  clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
});
const { sessionId } = await call('session/new', { cwd, mcpServers: [] });
// Cline offers the models of its own catalogue for openai-native; the editor picks the server's.
await call('session/set_model', { sessionId, modelId: 'sim' });
const turns = [];
for (const question of questions) {
  turn = { text: '', tool_calls: [] };
  const { stopReason } = await call('session/prompt', { sessionId, prompt: [{ type: 'text', text: question }] });
  turns.push({ ...turn, stop_reason: stopReason });
}
const exited = new Promise((resolve) => agent.on('exit', resolve));
agent.stdin.end(); // the editor goes away: Cline ends
await exited;

console.log(JSON.stringify({ session_id: sessionId, asked: questions, turns, permissions }));
