// The official OpenAI Node SDK against a live `tandem serve` (run by run.sh).
//
// Usage: node client.mjs BASE_URL FAULTY_BASE_URL
//   BASE_URL        a server started with --api-key test-key --served-model-name node-test
//   FAULTY_BASE_URL the same, with TANDEM_FAULT=step-throw@3 (fails mid-stream)
//
// Checks: completions.create (non-stream and stream, same greedy ids),
// models.list, and errors surfacing as the SDK's APIError subclasses with the
// right status, code and param. Prompts are token ids: tandem has no
// tokenizer yet, and the generated ids come in choices[0].token_ids.
import assert from 'node:assert/strict';
import OpenAI, { APIError } from 'openai';
import { VERSION } from 'openai/version';

const [baseURL, faultyURL] = process.argv.slice(2);
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
assert.deepEqual(whole.usage, { prompt_tokens: 4, completion_tokens: 8, total_tokens: 12 });

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
await expectApiError(client.completions.create({ ...request, n: 2 }), 400, 'unsupported_value', 'n');
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

console.log(`ok: create, stream, models and errors through openai ${VERSION}`);
