// The official openai SDK for Node against the server: a streamed HTTP tool loop
// chained by previous_response_id, and the ResponsesWS tool loop on one socket.
// Prints one JSON line per loop; tests/clients/test_node_sdk.py reads them.
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'dummy', maxRetries: 0 });
const tools = [{
  type: 'function', name: 'run_tests', strict: false,
  parameters: { type: 'object', properties: { target: { type: 'string' } } },
}];
const metadata = { sim_tool_calls: '2', sim_ttft_ms: '300' };

async function httpLoop() {
  const kinds = [];
  let previous;
  let input = 'Fix the flaky test.';
  for (let turn = 0; turn < 5; turn++) {
    const stream = client.responses.stream({
      model: 'sim', input, tools, metadata, previous_response_id: previous,
    });
    for await (const event of stream) kinds.push(event.type);
    const response = await stream.finalResponse();
    previous = response.id;
    const calls = response.output.filter((item) => item.type === 'function_call');
    if (calls.length === 0) return { loop: 'http', turns: turn + 1, text: response.output_text, kinds };
    input = calls.map((call) => ({ type: 'function_call_output', call_id: call.call_id, output: `ran ${turn}` }));
  }
  throw new Error('no final answer');
}

async function wsLoop() {
  const ws = new ResponsesWS(client);
  const kinds = [];
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
    const calls = response.output.filter((item) => item.type === 'function_call');
    if (calls.length === 0) {
      const text = response.output.filter((i) => i.type === 'message')
        .flatMap((i) => i.content).map((c) => c.text).join('');
      ws.close();
      return { loop: 'ws', turns: turn + 1, text, kinds };
    }
    input = calls.map((call) => ({ type: 'function_call_output', call_id: call.call_id, output: `ran ${turn}` }));
  }
  throw new Error('no final answer');
}

console.log(JSON.stringify(await httpLoop()));
console.log(JSON.stringify(await wsLoop()));
