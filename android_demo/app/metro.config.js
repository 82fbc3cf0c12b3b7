// Metro resolves the core from its TypeScript sources (../core/src) and watches that folder.
const path = require("path");
const { getDefaultConfig, mergeConfig } = require("@react-native/metro-config");

const core = path.resolve(__dirname, "../core");
module.exports = mergeConfig(getDefaultConfig(__dirname), {
  watchFolders: [core],
  resolver: {
    extraNodeModules: { "@edgespec/core": path.join(core, "src") },
    // the core's ES module imports name ".js" files; Metro finds the ".ts" sources
    sourceExts: ["ts", "tsx", "js", "jsx", "json", "mjs", "cjs"],
  },
});
