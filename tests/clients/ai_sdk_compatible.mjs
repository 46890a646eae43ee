// The Vercel AI SDK with @ai-sdk/openai-compatible on /v1/chat/completions (ai_sdk_common.mjs).
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { scenarios } from './ai_sdk_common.mjs';
import { main, versionOf } from './common.mjs';

const make = (base, model) => createOpenAICompatible({ name: 'berth', baseURL: `${base}/v1`, apiKey: 'unused' })(model);

await main(`${versionOf('ai')} + @ai-sdk/openai-compatible ${versionOf('@ai-sdk/openai-compatible')}`, scenarios(make, { schemaSent: false }));
