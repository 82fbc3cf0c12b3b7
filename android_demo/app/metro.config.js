// Metro bundles the app with the core's TypeScript sources (../core/src), not a built dist:
// - `@edgespec/core` resolves to ../core/src/index.ts (resolveRequest: extraNodeModules is only a fallback,
//   and the package's own "main" is the tsc output, which `npm ci` does not build);
// - the core's ES module imports name "./x.js" files that are "./x.ts" sources;
// - files under ../core find their packages (@babel/runtime, @huggingface/*) in this app's node_modules
//   (the same pins as ../core/package.json), whether or not ../core has a node_modules of its own.
const path = require("path");
const { getDefaultConfig, mergeConfig } = require("@react-native/metro-config");

const core = path.resolve(__dirname, "../core");
const coreEntry = path.join(core, "src", "index.ts");
const appOrigin = path.join(__dirname, "index.js");

module.exports = mergeConfig(getDefaultConfig(__dirname), {
  watchFolders: [core],
  resolver: {
    nodeModulesPaths: [path.resolve(__dirname, "node_modules")],
    resolveRequest(context, name, platform) {
      if (name === "@edgespec/core") return { type: "sourceFile", filePath: coreEntry };
      const origin = context.originModulePath;
      if (origin.startsWith(core + path.sep) && !origin.includes(`${path.sep}node_modules${path.sep}`)) {
        if (name.startsWith(".")) return context.resolveRequest(context, name.replace(/\.js$/, ""), platform);
        // a package the core imports: this app's copy (a core/node_modules from its own `npm ci` is ignored)
        return context.resolveRequest({ ...context, originModulePath: appOrigin }, name, platform);
      }
      return context.resolveRequest(context, name, platform);
    },
  },
});
