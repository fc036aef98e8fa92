// The official openai SDK for Node against the server: a streamed HTTP tool loop
// chained by previous_response_id, and the ResponsesWS tool loop on one socket.
// Both offer a function, a custom tool, a namespace and a hosted tool; each call is
// answered by its own kind of output. Prints one JSON line per loop;
// tests/clients/test_node_sdk.py reads them.
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'dummy', maxRetries: 0 });
// A function, a custom tool, a namespace holding a function, and a hosted tool
// (web_search: echoed, never offered to the model).
const tools = [
  {
    type: 'function', name: 'run_tests', strict: false,
    parameters: { type: 'object', properties: { target: { type: 'string' } } },
  },
  { type: 'custom', name: 'apply_diff', description: 'Apply a unified diff.' },
  {
    type: 'namespace', name: 'repo', description: 'The repository.',
    tools: [{
      type: 'function', name: 'read_file', strict: false,
      parameters: { type: 'object', properties: { path: { type: 'string' } } },
    }],
  },
  { type: 'web_search' },
];
const metadata = { sim_tool_calls: '3', sim_ttft_ms: '300' };
const CALLS = ['function_call', 'custom_tool_call'];

// Each call answered by its own kind of output.
function answers(calls, turn) {
  return calls.map((call) => ({
    type: call.type === 'custom_tool_call' ? 'custom_tool_call_output' : 'function_call_output',
    call_id: call.call_id,
    output: `ran ${turn}`,
  }));
}

function described(call) {
  return [call.type, call.name, call.namespace ?? null];
}

async function httpLoop() {
  const kinds = [];
  const made = [];
  let previous;
  let input = 'Fix the flaky test.';
  for (let turn = 0; turn < 5; turn++) {
    const stream = client.responses.stream({
      model: 'sim', input, tools, metadata, previous_response_id: previous,
    });
    for await (const event of stream) kinds.push(event.type);
    const response = await stream.finalResponse();
    previous = response.id;
    const calls = response.output.filter((item) => CALLS.includes(item.type));
    made.push(...calls.map(described));
    if (calls.length === 0) {
      const echoed = response.tools.map((tool) => tool.type);
      return { loop: 'http', turns: turn + 1, text: response.output_text, kinds, made, echoed };
    }
    input = answers(calls, turn);
  }
  throw new Error('no final answer');
}

async function wsLoop() {
  const ws = new ResponsesWS(client);
  const kinds = [];
  const made = [];
  const finished = [];
  let resolveTurn;
  ws.on('event', (event) => {
    kinds.push(event.type);
    if (event.type === 'response.completed') resolveTurn(event.response);
  });
  ws.on('error', (error) => { throw error; });
  let previous;
  let input = 'Fix the flaky test.';
  for (let turn = 0; turn < 5; turn++) {
    const done = new Promise((resolve) => { resolveTurn = resolve; });
    ws.send({ type: 'response.create', model: 'sim', input, tools, metadata, previous_response_id: previous });
    const response = await done;
    finished.push(response.id);
    previous = response.id;
    const calls = response.output.filter((item) => CALLS.includes(item.type));
    made.push(...calls.map(described));
    if (calls.length === 0) {
      const text = response.output.filter((i) => i.type === 'message')
        .flatMap((i) => i.content).map((c) => c.text).join('');
      const echoed = response.tools.map((tool) => tool.type);
      ws.close();
      return { loop: 'ws', turns: turn + 1, text, kinds, made, echoed };
    }
    input = answers(calls, turn);
  }
  throw new Error('no final answer');
}

console.log(JSON.stringify(await httpLoop()));
console.log(JSON.stringify(await wsLoop()));
