// The official OpenAI Node SDK against a live `tandem serve` (run by run.sh).
//
// Usage: node client.mjs BASE_URL FAULTY_BASE_URL TOOLS_BASE_URL IMAGE MISTRAL_BASE_URL
//   BASE_URL        a server started with --api-key test-key --served-model-name node-test
//   FAULTY_BASE_URL the same, with TANDEM_FAULT=step-throw@3 (fails mid-stream)
//   TOOLS_BASE_URL  the same options over a tiny Gemma 4 with its real tokenizer and
//                   chat template, every answer forced (TANDEM_FORCE_OUTPUT) to
//                   reasoning then a get_weather call (run.sh)
//   IMAGE           a PNG for the tool request with an image
//   MISTRAL_BASE_URL a tiny Mistral 3 forced to a get_weather call (JSON
//                   arguments, streamed in pieces)
//
// Checks: completions.create (non-stream and stream, same greedy ids),
// models.list, and errors surfacing as the SDK's APIError subclasses with the
// right status, code and param. Prompts are token ids (the model folder has
// no tokenizer), and the generated ids come in choices[0].token_ids. Then a
// tool-call round trip: message.tool_calls and reasoning_content, the SDK's
// own stream accumulator (chat.completions.stream), the call and its result
// sent back, and the same request with an image (the vision lane).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI, { APIError } from 'openai';
import { VERSION } from 'openai/version';

const [baseURL, faultyURL, toolsURL, imagePath, mistralURL] = process.argv.slice(2);
const options = { apiKey: 'test-key', maxRetries: 0, timeout: 30_000 };
const client = new OpenAI({ baseURL, ...options });
const request = { model: 'node-test', prompt: [1, 2, 3, 4], max_tokens: 8, temperature: 0, ignore_eos: true };

async function expectApiError(promise, status, code, param) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof APIError, `expected an APIError, got ${e}`);
    assert.equal(e.status, status, `status of: ${e.message}`);
    assert.equal(e.code, code, `code of: ${e.message}`);
    if (param !== undefined) assert.equal(e.param, param, `param of: ${e.message}`);
    return e;
  }
  assert.fail(`expected HTTP ${status} ${code}, but the call succeeded`);
}

// create, non-stream
const whole = await client.completions.create(request);
assert.equal(whole.object, 'text_completion');
assert.equal(whole.model, 'node-test');
assert.equal(whole.choices.length, 1);
assert.equal(whole.choices[0].finish_reason, 'length');
assert.equal(whole.choices[0].token_ids.length, 8);
assert.deepEqual(whole.usage, {
  prompt_tokens: 4, completion_tokens: 8, total_tokens: 12,
  prompt_tokens_details: { cached_tokens: 0 },  // a 4-token prompt fills no 16-token block
});

// create, stream, with usage
const stream = await client.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
const ids = [];
let finish = null;
let usage = null;
for await (const chunk of stream) {
  if (chunk.choices.length > 0) {
    ids.push(...chunk.choices[0].token_ids);
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}
assert.deepEqual(ids, whole.choices[0].token_ids, 'stream and non-stream give the same greedy ids');
assert.equal(finish, 'length');
assert.equal(usage.completion_tokens, 8);

// models
const models = [];
for await (const m of client.models.list()) models.push(m.id);
assert.deepEqual(models, ['node-test']);

// errors, each as its APIError subclass
let e = await expectApiError(client.completions.create({ ...request, model: 'gpt-4o' }), 404, 'model_not_found', 'model');
assert.ok(e instanceof OpenAI.NotFoundError);
e = await expectApiError(client.completions.create({ ...request, temperature: -1 }), 400, 'invalid_value', 'temperature');
assert.ok(e instanceof OpenAI.BadRequestError);
await expectApiError(client.completions.create({ ...request, n: 17 }), 400, 'invalid_value', 'n');

// n choices, through the SDK's types
const two = await client.completions.create({ ...request, n: 2 });
assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
assert.deepEqual(two.choices[0].token_ids, whole.choices[0].token_ids, 'greedy choices are equal');
assert.deepEqual(two.choices[1].token_ids, whole.choices[0].token_ids);
assert.equal(two.usage.completion_tokens, 2 * whole.usage.completion_tokens);
await expectApiError(
  client.chat.completions.create({ model: 'node-test', messages: [{ role: 'user', content: 'hi' }] }),
  400, 'no_chat_template', 'messages');
e = await expectApiError(new OpenAI({ baseURL, ...options, apiKey: 'wrong' }).models.list(), 401, 'invalid_api_key');
assert.ok(e instanceof OpenAI.AuthenticationError);

// a failure inside a stream: tokens, then the SDK throws the error event
const faulty = new OpenAI({ baseURL: faultyURL, ...options });
const failing = await faulty.completions.create({ ...request, stream: true });
const before = [];
try {
  for await (const chunk of failing) if (chunk.choices.length > 0) before.push(...chunk.choices[0].token_ids);
  assert.fail('the stream should have failed');
} catch (err) {
  assert.ok(err instanceof APIError, `expected an APIError, got ${err}`);
  assert.match(err.message, /internal error while running the model/);
}
assert.equal(before.length, 2, 'two tokens arrive before the injected failure');

// Tool calls (the answers are forced: see run.sh).
const agent = new OpenAI({ baseURL: toolsURL, ...options });
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
const answer = await agent.chat.completions.create({ model: 'node-test', messages: ask, tools });
const message = answer.choices[0].message;
assert.equal(answer.choices[0].finish_reason, 'tool_calls');
assert.equal(message.content, null);
assert.equal(message.reasoning_content, 'The user wants the weather in Paris.');
assert.equal(message.tool_calls.length, 1);
const [call] = message.tool_calls;
assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
assert.equal(call.type, 'function');
assert.equal(call.function.name, 'get_weather');
assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });

// Streamed, put together by the SDK's ChatCompletionStream.
const stream2 = agent.chat.completions.stream({ model: 'node-test', messages: ask, tools });
let reasoning = '';
let content = '';
const argumentsDone = [];
stream2.on('chunk', (chunk) => {
  reasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
  content += chunk.choices[0]?.delta?.content ?? '';
});
stream2.on('tool_calls.function.arguments.done', (e) => argumentsDone.push(e));
const final = await stream2.finalChatCompletion();
assert.equal(final.choices[0].finish_reason, 'tool_calls');
assert.equal(reasoning, message.reasoning_content);
assert.equal(content, '');
assert.equal(final.choices[0].message.tool_calls.length, 1);
assert.equal(final.choices[0].message.tool_calls[0].function.name, 'get_weather');
assert.equal(final.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);
assert.deepEqual(argumentsDone.map((e) => e.name), ['get_weather']);

// Arguments streamed in pieces as the model writes them (Mistral's JSON
// arguments; the answer is forced: see run.sh): the SDK's accumulator joins
// them into the same arguments as the non-stream answer.
const mistral = new OpenAI({ baseURL: mistralURL, ...options });
const mistralAsk = [{ role: 'system', content: 'Be brief.' }, ...ask];
const mistralWhole = await mistral.chat.completions.create({ model: 'node-test', messages: mistralAsk, tools });
assert.equal(mistralWhole.choices[0].message.tool_calls[0].function.arguments, '{"city":"Paris","unit":"celsius"}');
const stream3 = mistral.chat.completions.stream({ model: 'node-test', messages: mistralAsk, tools });
const argumentDeltas = [];
stream3.on('tool_calls.function.arguments.delta', (e) => argumentDeltas.push(e.arguments_delta));
const final3 = await stream3.finalChatCompletion();
assert.equal(final3.choices[0].finish_reason, 'tool_calls');
assert.equal(final3.choices[0].message.tool_calls[0].function.name, 'get_weather');
assert.equal(final3.choices[0].message.tool_calls[0].function.arguments,
  mistralWhole.choices[0].message.tool_calls[0].function.arguments);
assert.ok(argumentDeltas.length > 3, `arguments in pieces, got ${JSON.stringify(argumentDeltas)}`);
assert.equal(argumentDeltas.join(''), mistralWhole.choices[0].message.tool_calls[0].function.arguments);

// The round trip: the assistant's call and the tool's result go back through
// the template (the forced answer is the same call again).
const followUp = await agent.chat.completions.create({
  model: 'node-test',
  tools,
  messages: [...ask, message, { role: 'tool', tool_call_id: call.id, content: '20 C, sunny' }],
});
assert.ok(followUp.usage.prompt_tokens > answer.usage.prompt_tokens + 10, 'the call and result are in the prompt');
assert.equal(followUp.choices[0].message.tool_calls[0].function.name, 'get_weather');

// The same request with an image attached runs on the vision lane.
const image = `data:image/png;base64,${readFileSync(imagePath).toString('base64')}`;
const withImage = await agent.chat.completions.create({
  model: 'node-test',
  tools,
  messages: [{
    role: 'user',
    content: [{ type: 'image_url', image_url: { url: image } }, { type: 'text', text: 'What is the weather there?' }],
  }],
});
assert.equal(withImage.choices[0].finish_reason, 'tool_calls');
assert.deepEqual(JSON.parse(withImage.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris' });
const status = await (await fetch(`${toolsURL}/status`, { headers: { authorization: 'Bearer test-key' } })).json();
assert.equal(status.vision_lane_requests, 1);
await expectApiError(
  agent.chat.completions.create({ model: 'node-test', messages: ask, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
  400, 'invalid_value', 'tool_choice.function.name');

console.log(`ok: create, stream, models, errors, a tool-call round trip and streamed arguments through openai ${VERSION}`);
