// The OpenID provider the openid-connect plugin's tests run against: the certified `oidc-provider` package, on
// 127.0.0.1 and an ephemeral port, with one confidential client and one account. Started by
// crates/sluice-proxy/tests/plugins/oidc.rs; it exits when its stdin closes, so it never outlives the test.
//
//   node provider.mjs <client_id> <client_secret> <redirect_uri> <post_logout_redirect_uri>
//
// Prints one line, `listening http://127.0.0.1:PORT`, once it serves. Login goes through a small interaction form
// (no devInteractions): GET /interaction/:uid shows it, POST /interaction/:uid with login=alice&password=wonderland
// signs in; consent is granted by the same POST. Besides the provider's own endpoints (discovery, /jwks, /auth,
// /token, /me, /token/introspection, /session/end...), the test-only /__test/ paths:
//   POST /__test/sign  {"payload": {...}, "kid": "...", "key": "good"|"other", "alg": "RS256"|"none"}
//                       -> a compact JWS signed with the provider's own key ("good") or an unrelated one
//   GET  /__test/stats -> {"jwks": N, "discovery": N, "introspection": N, "token": N, "userinfo": N}
import http from 'node:http';
import { Provider } from 'oidc-provider';
import * as jose from 'jose';

const [clientId, clientSecret, redirectUri, postLogoutUri] = process.argv.slice(2);
if (!postLogoutUri) {
  console.error('usage: node provider.mjs CLIENT_ID CLIENT_SECRET REDIRECT_URI POST_LOGOUT_URI');
  process.exit(2);
}

const KID = 'sluice-test-key';
const good = await jose.generateKeyPair('RS256', { extractable: true });
const other = await jose.generateKeyPair('RS256', { extractable: true });
const goodJwk = { ...(await jose.exportJWK(good.privateKey)), kid: KID, alg: 'RS256', use: 'sig' };

const stats = { jwks: 0, discovery: 0, introspection: 0, token: 0, userinfo: 0 };
const ACCOUNT = { sub: 'alice', email: 'alice@example.com', email_verified: true, name: 'Alice Liddell' };

const server = http.createServer();
await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    post_logout_redirect_uris: [postLogoutUri],
    grant_types: ['authorization_code', 'refresh_token', 'client_credentials'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    introspection_endpoint_auth_method: 'client_secret_basic',
    scope: 'openid email profile offline_access api:read api:write',
  }],
  jwks: { keys: [goodJwk] },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
  scopes: ['openid', 'offline_access', 'email', 'profile', 'api:read', 'api:write'],
  findAccount: async (ctx, id) => (id === ACCOUNT.sub ? { accountId: id, claims: async () => ({ ...ACCOUNT }) } : undefined),
  features: {
    devInteractions: { enabled: false },
    introspection: { enabled: true },
    revocation: { enabled: true },
    clientCredentials: { enabled: true },
    rpInitiatedLogout: {
      enabled: true,
      // Logout confirmed without a form: the test drives it with plain requests.
      logoutSource: async (ctx, form) => {
        ctx.body = `<!DOCTYPE html><html><body>${form}<script>document.forms[0].submit()</script></body></html>`;
      },
    },
    resourceIndicators: {
      enabled: true,
      // Tokens asked for `resource=urn:sluice:api` are JWTs (verified locally by the gateway); others are opaque.
      defaultResource: async () => undefined,
      useGrantedResource: async () => false,
      getResourceServerInfo: async (ctx, resource) => {
        if (resource !== 'urn:sluice:api') throw new Error('unknown resource');
        return {
          scope: 'api:read api:write',
          audience: 'urn:sluice:api',
          accessTokenFormat: 'jwt',
          accessTokenTTL: 600,
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  pkce: { required: () => false },
  cookies: { keys: ['sluice-oidc-test-cookie-key'] },
  interactions: { url: async (ctx, interaction) => `/interaction/${interaction.uid}` },
  ttl: { AccessToken: 600, IdToken: 600, AuthorizationCode: 60, Interaction: 600, Session: 3600, Grant: 3600, ClientCredentials: 600 },
});

function readBody(req) {
  return new Promise((ok, fail) => {
    let b = '';
    req.setEncoding('utf8');
    req.on('data', (d) => { b += d; });
    req.on('end', () => ok(b));
    req.on('error', fail);
  });
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  if (req.method === 'GET') {
    const html = `<!DOCTYPE html><html><body><form method="post" action="/interaction/${details.uid}">`
      + '<input name="login"><input name="password" type="password"><button>Sign in</button></form></body></html>';
    return send(res, 200, 'text/html', html);
  }
  const form = new URLSearchParams(await readBody(req));
  if (form.get('login') !== 'alice' || form.get('password') !== 'wonderland') {
    return send(res, 401, 'text/plain', 'bad credentials');
  }
  const { params, prompt } = details;
  const grant = new provider.Grant({ accountId: 'alice', clientId: params.client_id });
  grant.addOIDCScope(String(params.scope || 'openid'));
  if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
  const result = { login: { accountId: 'alice' }, consent: { grantId: await grant.save() } };
  return provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
}

async function sign(req, res) {
  const { payload, kid, key, alg } = JSON.parse(await readBody(req));
  let jws;
  if (alg === 'none') {
    const enc = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
    jws = `${enc({ alg: 'none', typ: 'JWT', ...(kid ? { kid } : {}) })}.${enc(payload)}.`;
  } else {
    const header = { alg: alg || 'RS256', typ: 'JWT', ...(kid ? { kid } : {}) };
    jws = await new jose.CompactSign(Buffer.from(JSON.stringify(payload)))
      .setProtectedHeader(header)
      .sign(key === 'other' ? other.privateKey : good.privateKey);
  }
  return send(res, 200, 'text/plain', jws);
}

const callback = provider.callback();
server.on('request', async (req, res) => {
  try {
    const path = req.url.split('?')[0];
    if (path === '/__test/sign' && req.method === 'POST') return await sign(req, res);
    if (path === '/__test/stats') return send(res, 200, 'application/json', JSON.stringify(stats));
    if (path.startsWith('/interaction/')) return await interaction(req, res);
    if (path === '/jwks') stats.jwks += 1;
    if (path === '/.well-known/openid-configuration') stats.discovery += 1;
    if (path === '/token/introspection') stats.introspection += 1;
    if (path === '/token') stats.token += 1;
    if (path === '/me') stats.userinfo += 1;
    return callback(req, res);
  } catch (e) {
    console.error(e);
    if (!res.headersSent) send(res, 500, 'text/plain', String(e && e.message));
  }
});

process.stdin.on('end', () => process.exit(0));
process.stdin.on('close', () => process.exit(0));
process.stdin.resume();
console.log(`listening ${issuer}`);
