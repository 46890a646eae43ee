// The resolve hook register.mjs installs: a bare specifier not found from the importing file is
// resolved as if imported from $BERTH_CLIENT_NPM/package.json.
import { pathToFileURL } from 'node:url';

let parent;

export async function initialize(data) {
  if (!data.npm) throw new Error('BERTH_CLIENT_NPM is not set (scripts/client-deps prints it)');
  parent = pathToFileURL(`${data.npm}/package.json`).href;
}

export async function resolve(specifier, context, next) {
  try {
    return await next(specifier, context);
  } catch (e) {
    const bare = !/^(\.|\/|node:|file:|data:)/.test(specifier);
    if (bare && e.code === 'ERR_MODULE_NOT_FOUND') return next(specifier, { ...context, parentURL: parent });
    throw e;
  }
}
